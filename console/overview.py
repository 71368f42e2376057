"""The team's landing page (the dashboard): what the apps tell a team there, without console
importing them. Each app registers, in its AppConfig.ready(), the steps of the chain it owns
(``first_steps``) and the panels that summarise its objects (``panels``); they come in
INSTALLED_APPS order, which is the chain's (data, labels, training, serving).

A new team sees the steps as a guide, each with its page and whether the team has done it,
until its first endpoint serves. Every team sees the panels: what runs, what is new, what
serves, each item linked to its page. A panel costs a fixed number of queries, whatever the
number of objects (tests/test_query_counts.py).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from console import quotas
from console.models import AuditEvent, Team


@dataclass(frozen=True)
class Step:
    name: str  # stable, for tests and styles
    label: str
    help: str
    url: str
    done: bool
    # The chain is complete once the last step is done (a team that skips an optional step,
    # labeling data that came labeled, still finishes).
    optional: bool = False


first_steps: list[Callable[[Team], list[Step]]] = []

OVERVIEW_ITEMS = 5  # items a panel lists; its link leads to the rest


@dataclass(frozen=True)
class Panel:
    name: str  # stable, for tests and styles
    title: str
    url: str  # the page it summarises ("see all")
    template: str  # rendered with ``panel`` and the page's context
    context: dict = field(default_factory=dict)


panels: list[Callable[[Team], list[Panel]]] = []


def team_panels(team: Team) -> list[Panel]:
    """The apps' panels in the chain's order, then the team's storage and recent activity."""
    return [panel for provider in panels for panel in provider(team)] + console_panels(team)


def first_run(team: Team) -> list[Step]:
    """The guide's steps, or none once the last one is done."""
    steps = [step for provider in first_steps for step in provider(team)]
    if not steps or steps[-1].done:
        return []
    return steps


def next_step(steps: list[Step]) -> Step | None:
    """The first step not done that is not optional, else the first not done."""
    todo = [s for s in steps if not s.done]
    return next((s for s in todo if not s.optional), todo[0] if todo else None)


def sparkline(
    values: list[float], top: float | None = None, width: int = 120, height: int = 24
) -> str:
    """An SVG polyline's ``points`` for ``values`` spread over ``width`` × ``height``, ``top``
    (default: the highest value) at the top; all zero: a flat line at the bottom."""
    if not values:
        return ""
    top = top or max(values) or 1
    step = width / max(1, len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{height - 1 - (height - 2) * v / top:.1f}" for i, v in enumerate(values)
    )


# The team's work as its recent activity shows it (the audit log's other events, logins and
# memberships, stay on the owners' audit page).
ACTIVITY = {
    "dataset.create": gettext_lazy("created the dataset"),
    "dataset.delete": gettext_lazy("deleted the dataset"),
    "dataset_version.create": gettext_lazy("made a dataset version"),
    "labeling_project.create": gettext_lazy("created the labeling project"),
    "labeling_project.labels": gettext_lazy("changed the labels of"),
    "labeling_project.annotations": gettext_lazy("exported the annotations of"),
    "labeling_project.preannotate_start": gettext_lazy("pre-annotated"),
    "training.job_submit": gettext_lazy("submitted the training job"),
    "training.job_cancel": gettext_lazy("cancelled the training job"),
    "training.job_paused": gettext_lazy("paused at its quota:"),
    "training.sweep_create": gettext_lazy("started the hyperparameter search"),
    "training.model_compress": gettext_lazy("compressed"),
    "training.model_evaluate": gettext_lazy("evaluated"),
    "model.import": gettext_lazy("imported the model"),
    "model.delete": gettext_lazy("deleted the model"),
    "base_model.import": gettext_lazy("imported the base model"),
    "endpoint.deploy": gettext_lazy("deployed"),
    "endpoint.canary": gettext_lazy("started a canary on"),
    "endpoint.promote": gettext_lazy("promoted the canary of"),
    "endpoint.rollback": gettext_lazy("rolled back"),
    "endpoint.delete": gettext_lazy("deleted the endpoint"),
}


def console_panels(team: Team) -> list[Panel]:
    """The team's storage against its quota (an aggregate a kind of stored object), and its
    recent work."""
    storage = quotas.team_storage_usage(team)
    used, quota = sum(storage.values()), quotas.team_storage_quota(team)
    events = list(
        AuditEvent.objects.filter(team=team, action__in=ACTIVITY)
        .only("actor_username", "action", "target_repr", "created_at")
        .order_by("-created_at", "-id")[: 2 * OVERVIEW_ITEMS]
    )
    for event in events:
        event.verb = ACTIVITY[event.action]
    return [
        Panel(
            name="storage",
            title=_("Storage"),
            url=reverse("console:usage", kwargs={"team": team.slug}),
            template="console/_overview_storage.html",
            context={
                "kinds": [(quotas.storage_label(k), n) for k, n in storage.items()],
                "used": used,
                "quota": quota,
                "percent": min(100, round(100 * used / quota)) if quota else None,
            },
        ),
        Panel(
            name="activity",
            title=_("Recent activity"),
            url="",
            template="console/_overview_activity.html",
            context={"events": events},
        ),
    ]
