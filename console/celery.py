"""The Celery app of the platform, and the one place that routes tasks to queues."""

import os

from celery import Celery

from console.hardware import train_queues

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")

# Every task runs on `default` unless routed here. A training job goes to the queue of its
# device type (`train.cpu`, `train.gpu`, `train.npu`…, from platform/hardware/); a train worker
# consumes only the queues of the devices it has.
QUEUES = ["default", *train_queues()]
app.conf.task_routes = {
    "console.tasks.*": {"queue": "default"},
    "labeling.tasks.*": {"queue": "default"},
    "training.tasks.reconcile_training_jobs": {"queue": "default"},
    "training.tasks.run_training_job": {"queue": "train.cpu"},
    "deployment.tasks.*": {"queue": "default"},
}

# Beat's heartbeat, run by a worker; the dashboard reads its freshness.
BEAT_INTERVAL_S = 30
app.conf.beat_schedule = {
    "beat-heartbeat": {"task": "console.tasks.beat_heartbeat", "schedule": float(BEAT_INTERVAL_S)},
    # Reconciliation with Label Studio: webhooks are a hint, this is the guarantee.
    "labeling-reconcile": {"task": "labeling.tasks.reconcile_labeling_projects", "schedule": 60.0},
    # Jobs whose whole worker died are queued again (a killed pool process requeues at once).
    "training-reconcile": {"task": "training.tasks.reconcile_training_jobs", "schedule": 60.0},
    # Serving hosts hold what the endpoints say (and load again after a restart); their
    # request counters become the endpoints' charts.
    "deployment-reconcile": {"task": "deployment.tasks.reconcile_endpoints", "schedule": 10.0},
    "deployment-metrics": {"task": "deployment.tasks.collect_endpoint_metrics", "schedule": 15.0},
    "deployment-metrics-prune": {
        "task": "deployment.tasks.prune_endpoint_metrics",
        "schedule": 3600.0,
    },
}
app.autodiscover_tasks()
