import errno
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from console.models import Membership, Team
from console.roles import Role

ROOT = Path(__file__).resolve().parent.parent
# tests/runtime runs in the runtime venv (make test), without Django.
collect_ignore = ["runtime"]
# Trained exports, a serving host process: for tests/deployment and the browser tests.
pytest_plugins = ["tests.deployment.fixtures"]


@pytest.fixture
def make_user(db):
    def make(username: str, password: str = "pw-Secret-123", **extra):
        return get_user_model().objects.create_user(username=username, password=password, **extra)

    return make


@pytest.fixture
def make_team(db):
    def make(name: str, members: dict | None = None) -> Team:
        team = Team.objects.create(name=name, slug=name.lower())
        for user, role in (members or {}).items():
            Membership.objects.create(team=team, user=user, role=role)
        return team

    return make


def import_file(dataset, owner, data: bytes, fmt: str = "csv", mapping: dict | None = None):
    """Upload ``data`` and import it by the real path (upload, import job, pipeline); the job
    when it has finished."""
    from django.db import connection

    from labeling import services
    from labeling.task_kinds import schema_for

    upload = services.upload_create(
        actor=owner, team=dataset.team, filename=f"d.{fmt}", size=len(data)
    )
    services.upload_write_chunk(upload=upload, offset=0, stream=io.BytesIO(data), length=len(data))
    upload.refresh_from_db()
    if mapping is None:
        header = data.decode().splitlines()[0].split(",")
        mapping = schema_for(dataset.task_kind).propose_mapping(header)
    job = services.import_start(
        actor=owner,
        dataset=dataset,
        upload=upload,
        fmt=fmt,
        encoding="utf-8",
        options={"mapping": mapping},
    )
    if connection.in_atomic_block:
        # A `db` test: on-commit callbacks never run, so run the import as the task would.
        return services.import_run(job.pk)
    # A transactional test: the import was queued at commit; the suite's worker runs it.
    deadline = time.monotonic() + 60
    while job.status not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, "the worker did not run the import"
        time.sleep(0.2)
        job.refresh_from_db()
    return job


def make_version(dataset, owner, rows: list[list[str]] | None = None):
    """A dataset version of CSV ``rows`` (header first), made by the real import path."""
    import csv

    buf = io.StringIO()
    rows = rows or [["text", "label"], ["很好", "正面"], ["很差", "负面"], ["一般", "正面"]]
    csv.writer(buf, lineterminator="\n").writerows(rows)
    job = import_file(dataset, owner, buf.getvalue().encode())
    assert job.version is not None, job.error
    return job.version


def make_jsonl_version(dataset, owner, records: list[dict], mapping: dict):
    import json

    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    job = import_file(dataset, owner, data, fmt="jsonl", mapping=mapping)
    assert job.version is not None, job.error
    return job.version


@pytest.fixture
def owner(make_user):
    return make_user("olivia")


@pytest.fixture
def team(make_team, owner):
    return make_team("Alpha", {owner: Role.OWNER})


def test_database_url() -> str:
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
        "DATABASE_URL": test_database_url(),
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


@pytest.fixture(scope="session")
def celery_worker_process(django_db_setup) -> Iterator[subprocess.Popen]:
    """A real Celery worker on the suite's Redis and test database, queue `default`."""
    proc = start_worker("default", f"test-{os.getpid()}")
    yield proc
    stop_worker(proc)


@pytest.fixture(scope="session")
def train_worker(django_db_setup, celery_worker_process):
    """A real train worker (prefork: a killed job process is a lost worker, and its task is
    given back) on a node with two CPU slots, queue train.cpu, beside the `default` worker."""
    proc = start_train_worker(f"suite-{os.getpid()}", "cpu:2")
    yield proc
    stop_worker(proc)


class SmallDisk:
    """A tmpfs of a few megabytes mounted for one test: a disk that can be filled up."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ballast = path / "ballast"

    def fill(self) -> None:
        """Write until the disk is full (ENOSPC), leaving no free block."""
        with open(self.ballast, "ab") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        # Smaller writes may still fit in the last partial block: fill it byte by byte.
        with open(self.ballast, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 512)
            except OSError:
                pass

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)


@pytest.fixture
def small_disk() -> Iterator[SmallDisk]:
    """Needs root (mount), as CI has; elsewhere the test is skipped and says why. Not under
    pytest's tmp_path (0700): job runners, as PLATFORM_RUNNER_USER, work on it."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="small-disk-"))
    path.chmod(0o711)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        path.rmdir()
        if os.environ.get("CI"):
            pytest.fail(f"CI=true and a tmpfs cannot be mounted: {mounted.stderr!r}")
        pytest.skip(f"a full disk is simulated with a tmpfs, which needs root: {mounted.stderr!r}")
    yield SmallDisk(path)
    subprocess.run(["umount", "-l", str(path)], check=False)
    shutil.rmtree(path, ignore_errors=True)


def pytest_report_header(config) -> list[str]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    return [
        f"database: {db['ENGINE']} {db.get('HOST') or db['NAME']}",
        f"redis: {settings.REDIS_URL}",
    ]
