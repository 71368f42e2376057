"""The deployment app on a team's landing page (console.overview): its step in a new team's
guide, and its panel."""

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from console.models import Team
from console.overview import OVERVIEW_ITEMS, Panel, Step, sparkline
from deployment.models import Endpoint, MetricSample
from deployment.selectors import ENDPOINT_STATES, endpoint_state, team_endpoints_overview

SPARK_MINUTES, SPARK_POINTS = 60, 12  # the last hour, in five-minute steps


def first_steps(team: Team) -> list[Step]:
    return [
        Step(
            name="deploy",
            label=_("Deploy it as an endpoint"),
            help=_("Your applications call it with a key; try it on its page first."),
            url=reverse("deployment:endpoint_new", kwargs={"team": team.slug}),
            done=Endpoint.objects.filter(team=team).exists(),
        )
    ]


def panels(team: Team) -> list[Panel]:
    """The team's newest endpoints with their state and, over the last hour, their requests
    and failed answers as sparklines: four queries."""
    endpoints = list(team_endpoints_overview(team).order_by("-created_at", "-pk")[:OVERVIEW_ITEMS])
    since = timezone.now() - timedelta(minutes=SPARK_MINUTES)
    step = SPARK_MINUTES * 60 / SPARK_POINTS
    series = {e.pk: ([0] * SPARK_POINTS, [0] * SPARK_POINTS) for e in endpoints}
    samples = MetricSample.objects.filter(endpoint__in=endpoints, at__gt=since).values_list(
        "endpoint", "at", "requests", "errors", "client_errors", "unauthorized", "rate_limited"
    )
    for endpoint_id, at, requests, *failed in samples:
        i = min(SPARK_POINTS - 1, int((at - since).total_seconds() // step))
        series[endpoint_id][0][i] += requests
        series[endpoint_id][1][i] += sum(failed)
    rows = []
    for endpoint in endpoints:
        requests, errors = series[endpoint.pk]
        state = endpoint_state(endpoint, endpoint.active_revisions)
        rows.append(
            {
                "endpoint": endpoint,
                "state": state,
                "state_label": ENDPOINT_STATES[state],
                "requests": sum(requests),
                "errors": sum(errors),
                "requests_points": sparkline(requests, top=max(requests + errors)),
                # On the requests' scale: a few failures among many stay low.
                "errors_points": sparkline(errors, top=max(requests + errors)),
            }
        )
    return [
        Panel(
            name="endpoints",
            title=_("Endpoints"),
            url=reverse("deployment:endpoints", kwargs={"team": team.slug}),
            template="deployment/_overview_endpoints.html",
            context={"rows": rows},
        )
    ]
