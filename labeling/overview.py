"""The labeling app on a team's landing page (console.overview): its steps in a new team's
guide, and its panel."""

from django.db.models import Count
from django.urls import reverse
from django.utils.translation import gettext as _

from console.models import Team
from console.overview import OVERVIEW_ITEMS, Panel, Step
from labeling.models import Annotation, Dataset, LabelingProject


def first_steps(team: Team) -> list[Step]:
    return [
        Step(
            name="upload",
            label=_("Upload a dataset"),
            help=_("A CSV, XLSX or JSONL file of texts, labeled or not (UTF-8 or GBK)."),
            url=reverse("labeling:datasets", kwargs={"team": team.slug}),
            done=Dataset.objects.filter(team=team).exists(),
        ),
        Step(
            name="label",
            label=_("Label it in Label Studio"),
            help=_("Skip this when your data came labeled."),
            url=reverse("labeling:projects", kwargs={"team": team.slug}),
            done=LabelingProject.objects.filter(team=team).exists(),
            optional=True,
        ),
    ]


def panels(team: Team) -> list[Panel]:
    """The newest labeling projects, each with the tasks that have an annotation that counts
    out of its tasks: two queries."""
    projects = list(
        LabelingProject.objects.filter(team=team)
        .only("name", "status", "tasks_total", "created_at")
        .order_by("-created_at", "-pk")[:OVERVIEW_ITEMS]
    )
    annotated = dict(
        Annotation.objects.filter(project__in=projects, valid=True, rejected="")
        .values("project")
        .annotate(n=Count("task", distinct=True))
        .values_list("project", "n")
    )
    for project in projects:
        project.annotated = annotated.get(project.pk, 0)
    return [
        Panel(
            name="labeling",
            title=_("Labeling"),
            url=reverse("labeling:projects", kwargs={"team": team.slug}),
            template="labeling/_overview_projects.html",
            context={"projects": projects},
        )
    ]
