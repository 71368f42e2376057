"""Real workers on the suite's Redis and test database: Celery workers and train workers as
`make run` starts them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.helpers.system import ROOT


def suite_database_url() -> str:
    """The URL of the test database, for processes the suite starts."""
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"


def start_worker(queues: str, name: str, pool: str = "solo", env: dict | None = None):
    """A real Celery worker on the suite's Redis and test database; returns once it answers."""
    command = ["-m", "celery", "-A", "console", "worker", "--queues", queues]
    command += ["--concurrency", "1", "--pool", pool, "--hostname", f"{name}@%h"]
    return _start([*command, "--loglevel", "WARNING"], name, env)


def start_train_worker(node: str, devices: str, env: dict | None = None, wait: bool = True):
    """A real train worker as `make run` starts it (``manage.py train_worker``): a node of its
    own, with declared devices (PLATFORM_DEVICES: ``npu:2`` runs on the CPU underneath)."""
    # Beating every second: a transactional test's flush deletes the node's row, and the next
    # beat registers it again.
    env = {
        "PLATFORM_NODE_NAME": node,
        "PLATFORM_DEVICES": devices,
        "PLATFORM_NODE_HEARTBEAT_S": "1",
        **(env or {}),
    }
    command = ["manage.py", "train_worker", "--loglevel", "WARNING"]
    return _start(command, f"train@{node}", env, wait)


def _start(command: list[str], name: str, env: dict | None, wait: bool = True):
    """Start a worker; unless `wait` is False (a worker on another Redis than the suite's),
    return once it answers on the suite's Redis."""
    from console.health import check_workers

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": suite_database_url(),
        **(env or {}),
    }
    proc = subprocess.Popen([sys.executable, *command], cwd=ROOT, env=env)
    if not wait:
        return proc
    deadline = time.monotonic() + 60
    while name not in check_workers(timeout=1).detail:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(
                f"the Celery worker {name} did not come up (is Redis at REDIS_URL running?)"
            )
    return proc


def stop_worker(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def new_database(tmp_path, prefix: str):
    """A new, empty database of the suite's kind (a SQLite file under ``tmp_path``, or a
    PostgreSQL database beside the test database): its URL, and how to drop it."""
    import uuid

    from django.db import connection

    if connection.vendor == "sqlite":
        return f"sqlite:///{tmp_path / f'{prefix}.sqlite3'}", lambda: None
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return suite_database_url().rsplit("/", 1)[0] + f"/{name}", drop
