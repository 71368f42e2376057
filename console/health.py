"""Health of what the platform runs on: database, Redis, Celery workers, Celery beat."""

import time
from dataclasses import asdict, dataclass

import redis
from django.apps import apps
from django.conf import settings
from django.db import connection
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _

from console.celery import BEAT_INTERVAL_S, app

BEAT_KEY = "platform:beat:last"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def check_database() -> Check:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return Check("database", True, connection.vendor)
    except Exception as exc:
        return Check("database", False, str(exc))


def check_redis() -> Check:
    try:
        info = redis_client().info("server")
        return Check("redis", True, _("Redis %(version)s") % {"version": info["redis_version"]})
    except redis.RedisError as exc:
        return Check("redis", False, str(exc))


def check_workers(timeout: float = 1.0) -> Check:
    try:
        replies = app.control.ping(timeout=timeout)
    except Exception as exc:
        return Check("worker", False, str(exc))
    names = sorted(name for reply in replies for name in reply)
    if not names:
        return Check("worker", False, _("No Celery worker answered."))
    return Check("worker", True, ", ".join(names))


def check_beat() -> Check:
    try:
        last = redis_client().get(BEAT_KEY)
    except redis.RedisError as exc:
        return Check("beat", False, str(exc))
    if last is None:
        return Check("beat", False, _("Celery beat has not run yet."))
    age = time.time() - float(last)
    ok = age < 3 * BEAT_INTERVAL_S
    return Check("beat", ok, _("last heartbeat %(age)d s ago") % {"age": age})


def app_checks() -> list[Check]:
    """The checks apps declare as ``health_checks`` (dotted paths) on their AppConfig, so the
    console reports on services it does not import (Label Studio, serving hosts)."""
    return [
        import_string(path)()
        for config in apps.get_app_configs()
        for path in getattr(config, "health_checks", [])
    ]


def platform_health() -> list[Check]:
    redis_check = check_redis()
    if not redis_check.ok:
        # Workers and beat are only reachable through the broker; don't wait on its timeouts.
        down = _("the broker (Redis) is unreachable")
        core = [
            check_database(),
            redis_check,
            Check("worker", False, down),
            Check("beat", False, down),
        ]
    else:
        core = [check_database(), redis_check, check_workers(), check_beat()]
    return core + app_checks()


def record_beat() -> None:
    redis_client().set(BEAT_KEY, time.time(), ex=24 * 3600)
