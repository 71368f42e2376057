"""The deployment app's step in a new team's guide (console.overview)."""

from django.urls import reverse
from django.utils.translation import gettext as _

from console.models import Team
from console.overview import Step
from deployment.models import Endpoint


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
