"""Prometheus's view of the platform's processes: who may scrape a ``/metrics`` (one rule for
the console and the serving hosts), and the serving host's figures as metric families.

A scrape is allowed with the bearer token ``PLATFORM_METRICS_TOKEN`` where one is set, else only
from the addresses of ``PLATFORM_METRICS_ALLOW`` (networks, comma-separated; loopback by
default), so that an operator's Prometheus reads them and an endpoint's callers do not.
"""

import hmac
import ipaddress
import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from serving.metrics import BUCKETS_MS

CONTENT_TYPE = CONTENT_TYPE_LATEST
DEFAULT_ALLOW = "127.0.0.1/32,::1/128"
# Every third bound of the host's own buckets (x1.95 apart, 0.25 ms to about a minute): enough
# for quantiles, few enough series per endpoint and revision.
EXPORTED_BOUNDS = list(range(2, len(BUCKETS_MS), 3))

# The host's counters (serving.metrics.COUNTERS) by the response they count: what an operator's
# alert on errors by code reads.
ERROR_CODES = {
    "errors": "5xx",
    "client_errors": "4xx",
    "unauthorized": "401",
    "rate_limited": "429",
}


def scrape_allowed(authorization: str, client: str, token: str, allow: str) -> bool:
    """Whether a scrape with this ``Authorization`` header from address ``client`` is served."""
    if token:
        return hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode())
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    for net in filter(None, (n.strip() for n in allow.split(","))):
        try:
            if address in ipaddress.ip_network(net, strict=False):
                return True
        except ValueError:
            continue
    return False


def access_from_env() -> tuple[str, str]:
    """The token and the allowed networks, as the serving host reads them (no Django)."""
    token = os.environ.get("PLATFORM_METRICS_TOKEN", "")
    return token, os.environ.get("PLATFORM_METRICS_ALLOW", DEFAULT_ALLOW)


def histogram(
    family: HistogramMetricFamily, labels: list[str], counts: list[int], sum_ms: float
) -> None:
    """One series of a histogram from the host's per-bucket counts (milliseconds)."""
    cumulative, seen, at = [], 0, 0
    for i in EXPORTED_BOUNDS:
        seen += sum(counts[at : i + 1])
        at = i + 1
        cumulative.append((repr(BUCKETS_MS[i] / 1000), float(seen)))
    cumulative.append(("+Inf", float(sum(counts))))
    family.add_metric(labels, cumulative, sum_value=sum_ms / 1000)


class HostCollector:
    """The figures of one serving host at the moment of the scrape: per endpoint and revision,
    requests, inputs, tokens, errors by code, latency and time to the first token; per loaded
    revision, its batches, the inputs they held, the time inputs waited and the queue now."""

    def __init__(self, host: Any) -> None:
        self.host = host

    def collect(self) -> Iterator[Metric]:
        labels = ["endpoint", "revision"]
        counters = {
            name: CounterMetricFamily(f"platform_endpoint_{name}", help_, labels=labels)
            for name, help_ in (
                ("requests", "Calls to the endpoint."),
                ("inputs", "Texts predicted (generative: completions asked for)."),
                ("prompt_tokens", "Tokens generative endpoints read."),
                ("completion_tokens", "Tokens generative endpoints wrote."),
            )
        }
        errors = CounterMetricFamily(
            "platform_endpoint_errors", "Failed calls by response code.", labels=[*labels, "code"]
        )
        latency = HistogramMetricFamily(
            "platform_endpoint_latency_seconds", "Time to the whole answer.", labels=labels
        )
        ttft = HistogramMetricFamily(
            "platform_endpoint_time_to_first_token_seconds",
            "Generative endpoints: time to the first token.",
            labels=labels,
        )
        for (endpoint, revision), series in list(self.host.metrics.series.items()):
            values = [endpoint, revision]
            for name, family in counters.items():
                family.add_metric(values, series.counts[name])
            for counter, code in ERROR_CODES.items():
                errors.add_metric([*values, code], series.counts[counter])
            histogram(latency, values, series.latency, series.latency_sum_ms)
            if any(series.ttft):
                histogram(ttft, values, series.ttft, series.ttft_sum_ms)
        yield from counters.values()
        yield from (errors, latency, ttft)

        batches = CounterMetricFamily(
            "platform_revision_batches", "Batches run.", labels=["revision"]
        )
        batched = CounterMetricFamily(
            "platform_revision_batched_inputs", "Inputs the batches held.", labels=["revision"]
        )
        waited = CounterMetricFamily(
            "platform_revision_queue_wait_seconds",
            "Seconds the batched inputs waited in the queue, added up.",
            labels=["revision"],
        )
        queued = GaugeMetricFamily(
            "platform_revision_queued", "Inputs waiting now.", labels=["revision"]
        )
        ready = GaugeMetricFamily(
            "platform_revision_replicas_ready", "Predictor processes ready.", labels=["revision"]
        )
        for key, revision in list(self.host.revisions.items()):
            batches.add_metric([key], revision.batches)
            batched.add_metric([key], revision.batched_inputs)
            waited.add_metric([key], revision.queue_wait_s)
            queued.add_metric([key], revision.queue.qsize())
            alive = sum(r.alive for r in revision.replicas) if revision.state == "ready" else 0
            ready.add_metric([key], alive)
        yield from (batches, batched, waited, queued, ready)
        yield GaugeMetricFamily(
            "platform_serving_host_start_time_seconds",
            "When the host started (Unix time).",
            value=self.host.started_at,
        )


def exposition(collector: Any) -> bytes:
    """The text format of one collector's families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
