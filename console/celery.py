"""The Celery app of the platform, and the one place that routes tasks to queues."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")

# Every task runs on `default` unless routed here; training adds `train.<device>` queues.
QUEUES = ["default"]
app.conf.task_routes = {
    "console.tasks.*": {"queue": "default"},
    "labeling.tasks.*": {"queue": "default"},
}

# Beat's heartbeat, run by a worker; the dashboard reads its freshness.
BEAT_INTERVAL_S = 30
app.conf.beat_schedule = {
    "beat-heartbeat": {"task": "console.tasks.beat_heartbeat", "schedule": float(BEAT_INTERVAL_S)},
    # Reconciliation with Label Studio: webhooks are a hint, this is the guarantee.
    "labeling-reconcile": {"task": "labeling.tasks.reconcile_labeling_projects", "schedule": 60.0},
}
app.autodiscover_tasks()
