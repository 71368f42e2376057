"""The training app's step in a new team's guide (console.overview)."""

from django.urls import reverse
from django.utils.translation import gettext as _

from console.models import Team
from console.overview import Step
from training.models import ModelVersion


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
