"""The platform's figures for Prometheus (``GET /metrics``), read from the database, Redis and
the workers at the moment of the scrape, so that every console process answers alike: nodes and
their heartbeats, devices held and free, Celery's queues and the workers consuming them, the
data disk; and what the apps register in ``collectors`` (jobs, imports, Label Studio's sync,
endpoints). Console imports none of the apps.

Durations are histograms over every finished object (cumulative, as Prometheus expects),
counted by the database in one query (``duration_histogram``).

Beside them, Django's own request figures (django-prometheus's middleware: requests, latency
and responses by view, method and status), which each process counts for itself:
``django_exposition`` adds up every gunicorn worker's (gunicorn.conf.py).
"""

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, QuerySet, Sum
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from console.hardware import train_queues
from console.models import Device, Node

# Each returns metric families; registered by the apps in their AppConfig.ready().
collectors: list[Callable[[], Iterable[Metric]]] = []

# Bounds of the duration histograms, in seconds: a minute to three days.
DURATION_BOUNDS = (10, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 3 * 86400)


def duration_histogram(
    family: HistogramMetricFamily,
    labels: list[str],
    objects: QuerySet,
    start: str,
    end: str,
) -> None:
    """One series of ``family``: how long ``objects`` took from ``start`` to ``end`` (fields),
    those with both set, counted per bound by the database."""
    took = ExpressionWrapper(F(end) - F(start), output_field=DurationField())
    done = objects.filter(**{f"{start}__isnull": False, f"{end}__isnull": False})
    counts = {
        f"le{bound}": Count("pk", filter=Q(took__lte=timedelta(seconds=bound)))
        for bound in DURATION_BOUNDS
    }
    figures = done.annotate(took=took).aggregate(total=Count("pk"), sum=Sum("took"), **counts)
    buckets = [(str(float(b)), float(figures[f"le{b}"])) for b in DURATION_BOUNDS]
    buckets.append(("+Inf", float(figures["total"])))
    total = figures["sum"]
    family.add_metric(labels, buckets, sum_value=total.total_seconds() if total else 0.0)


def durations_by_status(
    name: str, help_: str, objects: QuerySet, statuses: Iterable[str], start: str, end: str
) -> HistogramMetricFamily:
    """A histogram family of how long ``objects`` of each status took (``duration_histogram``)."""
    family = HistogramMetricFamily(name, help_, labels=["status"])
    for status in statuses:
        duration_histogram(family, [status], objects.filter(status=status), start, end)
    return family


def _nodes() -> Iterator[Metric]:
    beat = GaugeMetricFamily(
        "platform_node_last_heartbeat_timestamp_seconds",
        "When each node's train worker last beat (Unix time); a node stopped on purpose is "
        "left out.",
        labels=["node"],
    )
    for name, at in Node.objects.filter(stopped_at__isnull=True).values_list(
        "name", "heartbeat_at"
    ):
        beat.add_metric([name], at.timestamp())
    yield beat
    devices = GaugeMetricFamily(
        "platform_devices", "Devices of the nodes, held or free.", labels=["device_type", "state"]
    )
    rows = Device.objects.values("device_type").annotate(
        held=Count("pk", filter=~Q(holder="")), free=Count("pk", filter=Q(holder=""))
    )
    for row in rows.order_by("device_type"):
        devices.add_metric([row["device_type"], "held"], row["held"])
        devices.add_metric([row["device_type"], "free"], row["free"])
    yield devices


def _queues() -> Iterator[Metric]:
    """Tasks waiting on each Celery queue (every priority's Redis list), and the workers that
    consume it (asked with a one-second timeout)."""
    from console.celery import app
    from console.health import redis_client

    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    sep, steps = options["sep"], [s for s in options["priority_steps"] if s]
    consumers: dict[str, int] = {}
    try:
        answers = app.control.inspect(timeout=1.0).active_queues() or {}
    except Exception:  # the broker down: the queues below say so (no figures at all)
        answers = {}
    for queues in answers.values():
        for queue in queues:
            consumers[queue["name"]] = consumers.get(queue["name"], 0) + 1
    nodes = Node.objects.values_list("name", flat=True)
    names = sorted({"default", *train_queues(), *(f"node.{n}" for n in nodes), *consumers})
    length = GaugeMetricFamily(
        "platform_celery_queue_length", "Tasks waiting on the queue.", labels=["queue"]
    )
    redis = redis_client()
    pipe = redis.pipeline()
    for name in names:
        for key in [name, *(f"{name}{sep}{s}" for s in steps)]:
            pipe.llen(key)
    lengths = iter(pipe.execute())
    for name in names:
        length.add_metric([name], sum(next(lengths) for _ in range(len(steps) + 1)))
    yield length
    workers = GaugeMetricFamily(
        "platform_celery_queue_workers", "Workers consuming the queue.", labels=["queue"]
    )
    for name in names:
        workers.add_metric([name], consumers.get(name, 0))
    yield workers


def _backups() -> Iterator[Metric]:
    """When the newest backup archive was written, where nightly backups are configured."""
    from console.backup import last_backup_at

    if not settings.BACKUP_DIR:
        return
    last = last_backup_at(Path(settings.BACKUP_DIR))
    yield GaugeMetricFamily(
        "platform_backup_last_success_timestamp_seconds",
        "When the newest backup archive in BACKUP_DIR was written (Unix time; 0: none).",
        value=last.timestamp() if last else 0.0,
    )


def _disk() -> Iterator[Metric]:
    usage = shutil.disk_usage(settings.DATA_DIR)
    yield GaugeMetricFamily(
        "platform_data_disk_size_bytes", "Size of the data directory's disk.", value=usage.total
    )
    yield GaugeMetricFamily(
        "platform_data_disk_free_bytes",
        "Free bytes of the data directory's disk.",
        value=usage.free,
    )


class PlatformCollector:
    """Every family of the platform, each source apart: one that fails (Redis down) leaves the
    others, and ``platform_scrape_errors`` counts it."""

    def collect(self) -> Iterator[Metric]:
        failed = 0
        for source in (_nodes, _queues, _disk, _backups, *collectors):
            try:
                yield from list(source())
            except Exception:
                failed += 1
        yield GaugeMetricFamily(
            "platform_scrape_errors", "Sources that failed in this scrape.", value=failed
        )
        yield GaugeMetricFamily(
            "platform_scrape_timestamp_seconds", "When this scrape was made.", value=time.time()
        )


def django_exposition() -> bytes:
    """Django's request figures in the text format: every worker's, from the directory they
    share where gunicorn runs several (PROMETHEUS_MULTIPROC_DIR), else this process's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)
