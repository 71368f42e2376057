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


@pytest.fixture
def owner(make_user):
    return make_user("olivia")


@pytest.fixture
def team(make_team, owner):
    return make_team("Alpha", {owner: Role.OWNER})


@pytest.fixture(scope="session")
def celery_worker_process() -> Iterator[subprocess.Popen]:
    """A real Celery worker on the suite's Redis, consuming the `default` queue."""
    from console.health import check_workers

    name = f"test-{os.getpid()}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "console",
            "worker",
            "--queues",
            "default",
            "--concurrency",
            "1",
            "--pool",
            "solo",
            "--hostname",
            f"{name}@%h",
            "--loglevel",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
    )
    deadline = time.monotonic() + 60
    while name not in check_workers(timeout=1).detail:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the Celery worker did not come up")
    yield proc
    proc.terminate()
    proc.wait(timeout=30)


def pytest_report_header(config) -> list[str]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    return [
        f"database: {db['ENGINE']} {db.get('HOST') or db['NAME']}",
        f"redis: {settings.REDIS_URL}",
    ]
