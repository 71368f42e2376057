"""The Celery app of the platform, and the one place that routes tasks to queues."""

import json
import logging
import os
import threading
import time

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from console.hardware import train_queues
from runtime.env import env_bool, env_float, env_int, env_str

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
    "training.tasks.advance_sweep": {"queue": "default"},
    "training.tasks.run_training_job": {"queue": "train.cpu"},
    "deployment.tasks.*": {"queue": "default"},
}

# Beat's heartbeat, run by a worker; the dashboard reads its freshness.
BEAT_INTERVAL_S = 30
app.conf.beat_schedule = {
    "beat-heartbeat": {"task": "console.tasks.beat_heartbeat", "schedule": float(BEAT_INTERVAL_S)},
    # Reconciliation with Label Studio: webhooks are a hint, this is the guarantee.
    "labeling-reconcile": {"task": "labeling.tasks.reconcile_labeling_projects", "schedule": 60.0},
    # Uploads abandoned for UPLOAD_EXPIRY_HOURS (never completed, or never imported) go.
    "labeling-expire-uploads": {"task": "labeling.tasks.expire_uploads", "schedule": 3600.0},
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
# The directory's accounts read again (console/directory.py), where one is configured.
if env_str("LDAP_SERVER_URI", "") and env_float("LDAP_SYNC_MINUTES", 15.0, min=0) > 0:
    app.conf.beat_schedule["directory-sync"] = {
        "task": "console.tasks.directory_sync",
        "schedule": env_float("LDAP_SYNC_MINUTES", 15.0, min=0) * 60,
    }
# The nightly backup (console/backup.py), where BACKUP_DIR is set.
if env_str("BACKUP_DIR", ""):
    from celery.schedules import crontab

    app.conf.beat_schedule["nightly-backup"] = {
        "task": "console.tasks.nightly_backup",
        "schedule": crontab(hour=env_int("BACKUP_HOUR", 2, min=0, max=23), minute=0),
    }
app.autodiscover_tasks()


# A train worker (started by `manage.py train_worker`) beats for its node: the nodes page shows
# when it stopped, and jobs wait for live nodes only.
_node_beating = threading.Event()


@worker_ready.connect
def _start_node_heartbeat(**_kwargs) -> None:
    if not env_bool("PLATFORM_TRAIN_WORKER", False):
        return
    from django.conf import settings
    from django.db import close_old_connections

    from console.hardware import NodeDevice
    from console.services import node_beat, node_redetect

    registration = json.loads(env_str("PLATFORM_NODE_REGISTRATION", "{}"))
    devices = [NodeDevice(**d) for d in registration.get("devices", [])]
    simulated, address = registration.get("simulated", False), registration.get("address", "")

    def beat() -> None:
        nonlocal devices
        detected_at = time.monotonic()
        while True:
            try:
                close_old_connections()
                node_beat(settings.NODE_NAME, devices, simulated=simulated, address=address)
                every = settings.NODE_REDETECT_S
                if not simulated and every and time.monotonic() - detected_at >= every:
                    detected_at = time.monotonic()
                    devices = node_redetect(settings.NODE_NAME, devices, address=address)
            except Exception:  # the database away for a while: beat again later
                logging.getLogger(__name__).exception("node heartbeat failed")
            if _node_beating.wait(settings.NODE_HEARTBEAT_S):
                return

    threading.Thread(target=beat, name="node-heartbeat", daemon=True).start()


@worker_shutdown.connect
def _stop_node_heartbeat(**_kwargs) -> None:
    if not env_bool("PLATFORM_TRAIN_WORKER", False):
        return
    from django.conf import settings

    from console.services import node_stop

    _node_beating.set()
    try:
        node_stop(settings.NODE_NAME)
    except Exception:
        logging.getLogger(__name__).exception("could not mark node stopped")
