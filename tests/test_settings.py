import os
import subprocess
import sys

import dj_database_url
import pytest
from django.conf import settings

from tests.helpers.system import ROOT


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


PRINT_SECURITY = (
    "import django; django.setup(); from django.conf import settings as s;"
    "print(s.DEBUG, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE,"
    " getattr(s, 'SECURE_PROXY_SSL_HEADER', None))"
)


@pytest.mark.parametrize(
    ("tls", "expected"),
    [("1", "False True True ('HTTP_X_FORWARDED_PROTO', 'https')"), ("", "False False False None")],
    ids=["behind-tls-proxy", "plain-http"],
)
def test_cookies_are_secure_when_served_over_https(tls, expected):
    env = {"DEBUG": "0", "SECRET_KEY": "a-real-secret-" * 4, "BEHIND_TLS_PROXY": tls}
    base = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "console.settings"}
    result = subprocess.run(
        [sys.executable, "-c", PRINT_SECURITY],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == expected, result.stderr


@pytest.mark.django_db
def test_pages_carry_the_security_headers_and_cookie_flags(client, owner, settings):
    """DEBUG off, served over HTTPS (as behind the operator's nginx): the headers that keep the
    console out of frames and sniffing, and session and CSRF cookies that scripts and plain
    HTTP never see."""
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert settings.DEBUG is False
    https = {"HTTP_X_FORWARDED_PROTO": "https"}
    page = client.get("/login/", **https)
    assert page["X-Frame-Options"] == "DENY"
    assert page["X-Content-Type-Options"] == "nosniff"
    assert page["Referrer-Policy"] == "same-origin"
    assert page["Cross-Origin-Opener-Policy"] == "same-origin"
    csrf = page.cookies[settings.CSRF_COOKIE_NAME]
    assert csrf["secure"] and csrf["samesite"] == "Lax"
    logged_in = client.post(
        "/login/", {"username": owner.username, "password": "pw-Secret-123"}, **https
    )
    assert logged_in.status_code == 302
    session = logged_in.cookies[settings.SESSION_COOKIE_NAME]
    assert session["secure"] and session["httponly"] and session["samesite"] == "Lax"
    # An error page shows no traceback or settings.
    missing = client.get("/t/nope/datasets/", **https)
    assert missing.status_code == 404 and b"Traceback" not in missing.content


@pytest.mark.parametrize(
    ("env", "refusal"),
    [
        ({"PLATFORM_CPU_SLOTS": "two"}, "PLATFORM_CPU_SLOTS='two': not an integer"),
        ({"BEHIND_TLS_PROXY": "maybe"}, "BEHIND_TLS_PROXY='maybe': not a boolean"),
        ({"SERVING_PORT": "70000"}, "SERVING_PORT='70000': must be at most 65535"),
        ({"TRAINING_MAX_HOURS": "-1"}, "TRAINING_MAX_HOURS='-1': must be at least 0"),
    ],
    ids=["bad-integer", "bad-boolean", "out-of-range", "negative"],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_value(env, refusal):
    result = load_settings({"DEBUG": "1", **env})
    assert result.returncode != 0
    assert f"django.core.exceptions.ImproperlyConfigured: environment variable {refusal}" in (
        result.stderr
    ), result.stderr


def test_the_serving_host_refuses_a_bad_value_at_start():
    """The serving host reads its variables through the same helpers: a bad one stops it at
    start with the variable and the value, before it listens."""
    result = subprocess.run(
        [settings.TRAINING_PYTHON, "-m", "serving"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "SERVING_SECRET": "s", "SERVING_MAX_BODY_MB": "lots"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "environment variable SERVING_MAX_BODY_MB='lots': not a number" in result.stderr
