"""Request metrics of endpoints: the serving hosts' cumulative counters scraped (beat, every
15 s), stored as the difference from the last scrape per endpoint, revision and host, and pruned
after ``SERVING_METRICS_RETENTION_DAYS``. Reads of them are in ``selectors.endpoint_metrics``."""

import logging
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from console.models import Team
from deployment.hosts import HostClient, HostError
from deployment.models import Endpoint, EndpointUsage, MetricSample, Revision, ServingHost
from serving.metrics import COUNTERS

log = logging.getLogger(__name__)


def metrics_collect(max_age_s: float = 0.0) -> int:
    """Scrape every reachable host's counters and store what changed since the last scrape;
    the number of samples written. Hosts scraped less than ``max_age_s`` ago are skipped."""
    written = 0
    for url in settings.SERVING_HOSTS:
        host, _created = ServingHost.objects.get_or_create(url=url)
        if host.metrics_at and (timezone.now() - host.metrics_at).total_seconds() < max_age_s:
            continue
        try:
            data = HostClient(host.url).metrics()
        except HostError as exc:
            log.info("metrics of %s: %s", url, exc)
            continue
        written += _metrics_store(host, data)
    return written


def metrics_prune() -> int:
    """Delete the samples older than ``SERVING_METRICS_RETENTION_DAYS``; how many."""
    cutoff = timezone.now() - timedelta(days=settings.SERVING_METRICS_RETENTION_DAYS)
    deleted, _per_model = MetricSample.objects.filter(at__lt=cutoff).delete()
    return deleted


HISTOGRAMS = ("latency", "ttft")


def _difference(now: list | None, was: list | None) -> list[int]:
    now = now or []
    was = was or [0] * len(now)
    return [a - b for a, b in zip(now, was, strict=False)]


@transaction.atomic
def _metrics_store(host: ServingHost, data: dict) -> int:
    host = ServingHost.objects.select_for_update().get(pk=host.pk)
    now = timezone.now()
    same_boot = host.metrics_boot_id == data["boot_id"]
    before = host.metrics_snapshot if same_boot else {}
    window = (now - host.metrics_at).total_seconds() if same_boot and host.metrics_at else 0.0
    # A generative endpoint's adapters count as "<endpoint>/<adapter>".
    names = {name.partition("/")[0] for name in data["endpoints"]}
    endpoints = {e.name: e for e in Endpoint.objects.filter(name__in=names).select_related("team")}
    samples = []
    for name, revisions in data["endpoints"].items():
        endpoint_name, _slash, adapter = name.partition("/")
        endpoint = endpoints.get(endpoint_name)
        if endpoint is None:
            continue
        for key, now_counts in revisions.items():
            was = before.get(name, {}).get(key) or {}
            delta = {c: now_counts.get(c, 0) - was.get(c, 0) for c in COUNTERS}
            histograms = {h: _difference(now_counts.get(h), was.get(h)) for h in HISTOGRAMS}
            if min(*delta.values(), *histograms["latency"], *histograms["ttft"]) < 0:
                # Counters went back: a restart we missed.
                delta = {c: now_counts.get(c, 0) for c in COUNTERS}
                histograms = {h: list(now_counts.get(h) or []) for h in HISTOGRAMS}
            if not any(delta.values()):
                continue
            pk = Revision.pk_from_key(key)
            samples.append(
                MetricSample(
                    endpoint=endpoint,
                    revision_id=pk if pk and endpoint.revisions.filter(pk=pk).exists() else None,
                    adapter=adapter[:60],
                    host=host,
                    at=now,
                    window_s=window,
                    **histograms,
                    **delta,
                )
            )
    MetricSample.objects.bulk_create(samples)
    _usage_add(samples, now)
    host.metrics_boot_id, host.metrics_snapshot, host.metrics_at = (
        data["boot_id"],
        data["endpoints"],
        now,
    )
    host.save(update_fields=["metrics_boot_id", "metrics_snapshot", "metrics_at"])
    return len(samples)


def _usage_add(samples: list[MetricSample], now) -> None:
    """Add the samples' requests and tokens to their endpoints' months (EndpointUsage)."""
    month = timezone.localtime(now).date().replace(day=1)
    for s in samples:
        row, _created = EndpointUsage.objects.select_for_update().get_or_create(
            team_name=s.endpoint.team.name,
            endpoint_name=s.endpoint.name,
            adapter=s.adapter,
            month=month,
            defaults={"team": s.endpoint.team, "endpoint": s.endpoint},
        )
        EndpointUsage.objects.filter(pk=row.pk).update(
            requests=F("requests") + s.requests,
            errors=F("errors") + s.errors,
            prompt_tokens=F("prompt_tokens") + s.prompt_tokens,
            completion_tokens=F("completion_tokens") + s.completion_tokens,
        )


def endpoint_usage(team: Team | None, start) -> list[dict]:
    """The month's requests and tokens per endpoint and adapter (of one team, or all): the
    usage page's serving section (registered in console.usage.serving_usage)."""
    rows = EndpointUsage.objects.filter(month=timezone.localtime(start).date())
    if team is not None:
        rows = rows.filter(team=team)
    return [
        {
            "team": r.team_name,
            "endpoint": r.endpoint_name + (f"/{r.adapter}" if r.adapter else ""),
            "requests": r.requests,
            "errors": r.errors,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
        }
        for r in rows.order_by("team_name", "endpoint_name", "adapter")
    ]


def serving_metrics() -> Iterator[Metric]:
    """For Prometheus (console.metrics.collectors): endpoints, and each serving host as the
    platform last reached it (each host's own /metrics has its requests and latency)."""
    yield GaugeMetricFamily("platform_endpoints", "Endpoints.", value=Endpoint.objects.count())
    reachable = GaugeMetricFamily(
        "platform_serving_host_reachable",
        "Whether the platform reached the serving host at its last check.",
        labels=["host"],
    )
    for url, ok in ServingHost.objects.values_list("url", "reachable"):
        reachable.add_metric([url], float(ok))
    yield reachable
