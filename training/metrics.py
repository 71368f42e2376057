"""Training's figures for Prometheus (registered in console.metrics.collectors): jobs by
status and device type now, and how long finished jobs ran, by how they ended."""

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily, Metric

from console.metrics import durations_by_status
from training.models import TrainingJob


def job_metrics() -> Iterator[Metric]:
    jobs = GaugeMetricFamily(
        "platform_training_jobs", "Training jobs by status.", labels=["status", "device_type"]
    )
    rows = TrainingJob.objects.values("status", "device_type").annotate(n=Count("pk"))
    for row in rows.order_by("status", "device_type"):
        jobs.add_metric([row["status"], row["device_type"]], row["n"])
    yield jobs
    yield durations_by_status(
        "platform_training_job_duration_seconds",
        "How long finished jobs ran, from their start to their end, by how they ended.",
        TrainingJob.objects.all(),
        (TrainingJob.Status.SUCCEEDED, TrainingJob.Status.FAILED),
        "started_at",
        "finished_at",
    )
