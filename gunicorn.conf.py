"""gunicorn's settings for the console (read from the working directory by every way the
platform starts it: `make run`'s Procfile, systemd, Compose, Kubernetes; the command lines keep
the rest).

Django's request figures (django-prometheus) are counted by each worker process: they go to
files in one directory that every worker shares (prometheus-client's multiprocess mode), so
that any worker's /metrics answers for all of them. The directory is new at every start.
"""

import os
import shutil
import tempfile


def on_starting(server) -> None:
    # Before the workers fork and import Django: prometheus-client reads it at import.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="platform-metrics-")


def child_exit(server, worker) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server) -> None:
    shutil.rmtree(os.environ.get("PROMETHEUS_MULTIPROC_DIR", ""), ignore_errors=True)
