import os
import subprocess
import sys

import pytest
from django.test import override_settings
from django.urls import reverse

from console import health
from console.tasks import beat_heartbeat
from tests.helpers.system import ROOT, spare_redis_url


def test_database_and_redis_are_alive(db):
    assert health.check_database().ok
    redis_check = health.check_redis()
    assert redis_check.ok, redis_check.detail
    assert redis_check.detail.startswith("Redis")


@override_settings(REDIS_URL="redis://127.0.0.1:1/0")
def test_redis_down_is_reported_not_raised():
    check = health.check_redis()
    assert not check.ok and check.detail


def health_in_subprocess(redis_url: str) -> str:
    """The platform's health as a fresh process configured with `redis_url` sees it."""
    code = (
        "import django; django.setup(); from django.utils import translation; "
        "translation.activate('en'); from console import health; "
        "print(health.platform_health())"
    )
    env = {**os.environ, "REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_no_worker_and_no_beat_are_reported(celery_worker_process):
    # Another Redis database is another virtual host: the suite's worker does not listen there.
    other_db = spare_redis_url()
    out = health_in_subprocess(other_db)
    assert "ok=False, detail='No Celery worker answered.'" in out
    assert "name='beat', ok=False" in out


def test_broker_down_is_reported_not_raised():
    out = health_in_subprocess("redis://127.0.0.1:1/0")
    assert "name='redis', ok=False" in out
    assert "name='worker', ok=False, detail='the broker (Redis) is unreachable'" in out


def test_a_real_worker_answers_and_runs_the_beat_heartbeat(celery_worker_process):
    check = health.check_workers()
    assert check.ok and "test-" in check.detail
    health.redis_client().delete(health.BEAT_KEY)
    assert not health.check_beat().ok
    beat_heartbeat.delay().get(timeout=30)
    assert health.check_beat().ok


@pytest.mark.usefixtures("celery_worker_process")
def test_dashboard_health_panel_and_api(client, owner, team):
    client.force_login(owner)
    panel = client.get(reverse("console:health")).content.decode()
    for name in ("database", "redis", "worker"):
        assert f'data-check="{name}" data-ok="true"' in panel
    checks = {c["name"]: c["ok"] for c in client.get("/api/v1/health/").json()}
    assert checks["database"] and checks["redis"] and checks["worker"]
    # Apps add theirs: Label Studio's (alive under `make test`, which starts it).
    assert "labelstudio" in checks
    if os.environ.get("LABEL_STUDIO_URL"):
        assert checks["labelstudio"] and 'data-check="labelstudio" data-ok="true"' in panel
