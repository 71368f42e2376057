"""The training app on a team's landing page (console.overview): its step in a new team's
guide, and its panels."""

from django.db.models import Case, Count, When
from django.urls import reverse
from django.utils.translation import gettext as _

from console.models import Team
from console.overview import OVERVIEW_ITEMS, Panel, Step
from training.models import ModelVersion, TrainingJob, headline_metric


def first_steps(team: Team) -> list[Step]:
    return [
        Step(
            name="train",
            label=_("Train a model"),
            help=_("Pick a dataset version; the recommended model and settings fit this site."),
            url=reverse("training:job_new", kwargs={"team": team.slug}),
            done=ModelVersion.objects.filter(team=team).exists(),
        )
    ]


def panels(team: Team) -> list[Panel]:
    """What trains now (running first, then the queue, with progress and why a job waits) and
    the newest model versions with the figure each is judged by: four queries."""
    active = TrainingJob.objects.filter(team=team, status__in=TrainingJob.ACTIVE)
    counts = dict(active.values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
    jobs = list(
        active.select_related("base_model")
        .defer("hyperparameters", "data_report", "resume_files", "error")
        .order_by(
            Case(When(status=TrainingJob.Status.RUNNING, then=0), default=1), "priority", "pk"
        )[:OVERVIEW_ITEMS]
    )
    versions = list(
        ModelVersion.objects.filter(team=team)
        .only("name", "number", "task_kind", "metrics", "created_at")
        .order_by("-created_at", "-pk")[:OVERVIEW_ITEMS]
    )
    for version in versions:
        version.headline = headline_metric(version)
    return [
        Panel(
            name="jobs",
            title=_("Training"),
            url=reverse("training:jobs", kwargs={"team": team.slug}),
            template="training/_overview_jobs.html",
            context={
                "jobs": jobs,
                "running": counts.get(TrainingJob.Status.RUNNING, 0),
                "queued": counts.get(TrainingJob.Status.QUEUED, 0),
            },
        ),
        Panel(
            name="models",
            title=_("Latest models"),
            url=reverse("training:models", kwargs={"team": team.slug}),
            template="training/_overview_models.html",
            context={"versions": versions},
        ),
    ]
