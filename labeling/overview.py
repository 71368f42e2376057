"""The labeling app's steps in a new team's guide (console.overview)."""

from django.urls import reverse
from django.utils.translation import gettext as _

from console.models import Team
from console.overview import Step
from labeling.models import Dataset, LabelingProject


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
