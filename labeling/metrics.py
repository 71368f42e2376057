"""Labeling's figures for Prometheus (registered in console.metrics.collectors): how long
imports took, by how they ended, and how far the Label Studio projects' sync lags."""

import time
from collections.abc import Iterator

from django.db.models import Min
from prometheus_client.core import GaugeMetricFamily, Metric

from console.metrics import durations_by_status
from labeling.models import ImportJob, LabelingProject


def labeling_metrics() -> Iterator[Metric]:
    yield durations_by_status(
        "platform_import_duration_seconds",
        "How long finished imports took, from the upload's submission, by how they ended.",
        ImportJob.objects.all(),
        (ImportJob.Status.SUCCEEDED, ImportJob.Status.FAILED),
        "created_at",
        "finished_at",
    )
    ready = LabelingProject.objects.filter(status=LabelingProject.Status.READY)
    oldest = ready.aggregate(at=Min("last_synced_at"))["at"]
    yield GaugeMetricFamily(
        "platform_labeling_sync_lag_seconds",
        "Seconds since the least recently synced Label Studio project was synced.",
        value=max(0.0, time.time() - oldest.timestamp()) if oldest else 0.0,
    )
    yield GaugeMetricFamily(
        "platform_labeling_projects", "Labeling projects ready.", value=ready.count()
    )
