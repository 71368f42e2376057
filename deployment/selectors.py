"""Reads of the deployment app, scoped to a team (another team's objects are 404)."""

from datetime import timedelta

from django.db.models import Prefetch, QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from console.models import Team
from deployment.models import (
    Endpoint,
    EndpointAdapter,
    EndpointKey,
    MetricSample,
    Placement,
    Revision,
    ServingHost,
)
from serving.metrics import BUCKETS_MS, COUNTERS, percentile
from training.models import ModelEvaluation


def team_endpoints(team: Team) -> QuerySet[Endpoint]:
    return Endpoint.objects.filter(team=team).prefetch_related(
        Prefetch(
            "revisions",
            Revision.objects.filter(status=Revision.Status.ACTIVE).select_related("model_version"),
            to_attr="active_revisions",
        )
    )


def team_endpoints_overview(team: Team) -> QuerySet[Endpoint]:
    """The team's endpoints for a list: each with its active revisions (``active_revisions``),
    their model versions and placements, in three queries whatever the number of endpoints."""
    return Endpoint.objects.filter(team=team).prefetch_related(
        Prefetch(
            "revisions",
            Revision.objects.filter(status=Revision.Status.ACTIVE)
            .select_related("model_version")
            .prefetch_related("placements"),
            to_attr="active_revisions",
        )
    )


def serving_hosts() -> QuerySet[ServingHost]:
    """The serving hosts as the reconciler last found them (shared by every team)."""
    return ServingHost.objects.all()


def endpoint_get(team: Team, endpoint_id: int) -> Endpoint:
    return get_object_or_404(team_endpoints(team), pk=endpoint_id)


def endpoint_revisions(endpoint: Endpoint) -> QuerySet[Revision]:
    return (
        endpoint.revisions.select_related("model_version")
        .prefetch_related(Prefetch("placements", Placement.objects.select_related("host")))
        .order_by("-number")
    )


def revision_get(endpoint: Endpoint, revision_id: int) -> Revision:
    return get_object_or_404(endpoint.revisions.all(), pk=revision_id)


def endpoint_keys(endpoint: Endpoint) -> QuerySet[EndpointKey]:
    return endpoint.keys.all()


def endpoint_adapters(endpoint: Endpoint) -> QuerySet[EndpointAdapter]:
    return endpoint.adapters.select_related("model_version").order_by("name")


def endpoint_adapter_get(endpoint: Endpoint, adapter_id: int) -> EndpointAdapter:
    return get_object_or_404(endpoint_adapters(endpoint), pk=adapter_id)


def endpoint_evaluations(endpoint: Endpoint) -> QuerySet[ModelEvaluation]:
    """The endpoint's scores on evaluation sets (``deployment.evaluations``), newest first."""
    return ModelEvaluation.objects.filter(
        team_id=endpoint.team_id, endpoint__id=endpoint.pk
    ).select_related("model_version", "dataset_version__dataset")


def endpoint_key_get(endpoint: Endpoint, key_id: int) -> EndpointKey:
    return get_object_or_404(endpoint.keys.all(), pk=key_id)


# An endpoint's state, as endpoint_state() names it, and how the console says it.
ENDPOINT_STATES = {
    "ready": _("ready"),
    "loading": _("loading"),
    "failed": _("failed"),
    "unplaced": _("waiting for a serving host"),
}


def endpoint_state(endpoint: Endpoint, revisions) -> str:
    """ready (every active revision ready on a host), loading, failed or unplaced."""
    states = []
    for rev in revisions:
        if rev.status != Revision.Status.ACTIVE:
            continue
        placed = [p.state for p in rev.placements.all()]
        if not placed:
            states.append("unplaced")
        elif Placement.State.READY in placed:
            states.append("ready")
        elif Placement.State.FAILED in placed:
            states.append("failed")
        else:
            states.append("loading")
    for worst in ("failed", "unplaced", "loading"):
        if worst in states:
            return worst
    return "ready" if states else "unplaced"


def endpoint_metrics(endpoint: Endpoint, minutes: int = 60, points: int = 30) -> dict:
    """Totals over the last ``minutes`` and a series of ``points`` time steps: requests per
    second, p50/p95/p99 latency (ms), error rate, and for generative endpoints tokens per
    second and the time to the first token (p50/p95); and totals per revision and per
    adapter (``""``: the endpoint's own model)."""
    now = timezone.now()
    since = now - timedelta(minutes=minutes)
    step = minutes * 60 / points
    samples = list(
        MetricSample.objects.filter(endpoint=endpoint, at__gt=since).values(
            "at", "revision_id", "adapter", "latency", "ttft", *COUNTERS
        )
    )
    width = len(BUCKETS_MS) + 1

    def empty() -> dict:
        return {**dict.fromkeys(COUNTERS, 0), "latency": [0] * width, "ttft": [0] * width}

    def add(acc: dict, s: dict) -> None:
        for c in COUNTERS:
            acc[c] += s[c]
        for h in ("latency", "ttft"):
            for i, n in enumerate((s[h] or [])[:width]):
                acc[h][i] += n

    total, per_revision, per_adapter = empty(), {}, {}
    buckets = [empty() for _ in range(points)]
    for s in samples:
        add(total, s)
        add(per_revision.setdefault(s["revision_id"], empty()), s)
        add(per_adapter.setdefault(s["adapter"], empty()), s)
        index = min(points - 1, int((s["at"] - since).total_seconds() // step))
        add(buckets[index], s)

    def figures(acc: dict, seconds: float) -> dict:
        failed = acc["errors"] + acc["client_errors"] + acc["unauthorized"] + acc["rate_limited"]
        n = acc["requests"]
        return {
            **{c: acc[c] for c in COUNTERS},
            "qps": round(acc["requests"] / seconds, 3) if seconds else 0,
            "p50_ms": percentile(acc["latency"], 0.50),
            "p95_ms": percentile(acc["latency"], 0.95),
            "p99_ms": percentile(acc["latency"], 0.99),
            # Every answer but a prediction, and the host's own failures (5xx) alone.
            "error_rate": round(failed / n, 4) if n else 0,
            "server_error_rate": round(acc["errors"] / n, 4) if n else 0,
            "tokens_per_s": round(acc["completion_tokens"] / seconds, 3) if seconds else 0,
            "ttft_p50_ms": percentile(acc["ttft"], 0.50),
            "ttft_p95_ms": percentile(acc["ttft"], 0.95),
        }

    return {
        "minutes": minutes,
        "total": figures(total, minutes * 60),
        "revisions": {str(k): figures(v, minutes * 60) for k, v in per_revision.items() if k},
        "adapters": {k: figures(v, minutes * 60) for k, v in per_adapter.items() if k},
        "series": [
            {"t": (since + timedelta(seconds=step * (i + 1))).isoformat(), **figures(b, step)}
            for i, b in enumerate(buckets)
        ],
    }
