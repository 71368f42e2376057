import os
import subprocess
import sys

import dj_database_url
import pytest
from django.conf import settings

from tests.conftest import ROOT


def load_settings(env: dict) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "console.settings"}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); print('started')"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_debug_off_refuses_the_default_secret():
    result = load_settings({"DEBUG": "0"})
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr


def test_debug_off_refuses_empty_allowed_hosts():
    result = load_settings({"DEBUG": "0", "SECRET_KEY": "x" * 50, "ALLOWED_HOSTS": " , "})
    assert result.returncode != 0
    assert "ALLOWED_HOSTS is empty" in result.stderr


@pytest.mark.parametrize(
    "env",
    [{"DEBUG": "1"}, {"DEBUG": "0", "SECRET_KEY": "a-real-secret-" * 4}],
    ids=["debug-with-default-secret", "production-with-secret"],
)
def test_starts_when_configured(env):
    result = load_settings(env)
    assert result.returncode == 0, result.stderr
    assert "started" in result.stdout


def test_chinese_defaults():
    assert settings.LANGUAGE_CODE == "zh-hans"
    assert settings.TIME_ZONE == "Asia/Shanghai"
    assert ("en", "English") in settings.LANGUAGES


def test_database_url_selects_postgresql():
    config = dj_database_url.parse("postgres://platform:pw@db.example:5432/platform")
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert config["NAME"] == "platform"


def test_celery_is_configured_for_long_tasks():
    from console.celery import app

    conf = app.conf
    assert conf.broker_url == settings.REDIS_URL
    assert conf.task_serializer == "json" and conf.accept_content == ["json"]
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.task_default_queue == "default"


def test_ci_runs_on_postgresql_and_an_external_redis(db):
    """CI exercises the production pair; a local run may use SQLite and a throwaway Redis."""
    from django.db import connection

    if not os.environ.get("CI"):
        pytest.skip("not CI: any database and Redis will do")
    assert connection.vendor == "postgresql"
    assert settings.REDIS_URL == os.environ["REDIS_URL"]
