"""A team's hyperparameter searches, attacked from another team: a member of team B reads,
cancels and lists nothing of team A's sweeps, by the API or the console, and cannot start a
sweep on A's dataset version."""

import pytest
from django.test import Client
from django.urls import reverse

from console.roles import Role
from console.services import api_token_create
from labeling.datasets import dataset_create
from tests.helpers.data import version_for
from training.models import Sweep
from training.sweeps import sweep_create

pytestmark = pytest.mark.django_db


def test_another_team_gets_404_for_a_sweep_and_cannot_sweep_its_data(make_user, make_team):
    alice, mallory = make_user("alice"), make_user("mallory")
    team_a = make_team("Alpha", {alice: Role.OWNER})
    team_b = make_team("Bravo", {mallory: Role.OWNER})
    dataset = dataset_create(
        actor=alice, team=team_a, name="reviews", task_kind="text_classification"
    )
    version = version_for(dataset, alice, 80)
    sweep = sweep_create(
        actor=alice,
        team=team_a,
        dataset_version=version,
        space={"dropout": {"low": 0.0, "high": 0.3}},
        n_trials=2,
    )
    _token, key = api_token_create(actor=mallory, name="m")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_ACCEPT_LANGUAGE="en")
    # Through her own team's URLs: A's sweep is not there.
    mine = f"/api/v1/teams/{team_b.slug}/sweeps/"
    assert api.get(f"{mine}{sweep.pk}/").status_code == 404
    assert api.post(f"{mine}{sweep.pk}/cancel/").status_code == 404
    assert api.get(mine).json()["results"] == []
    # Through A's URLs: not a member.
    theirs = f"/api/v1/teams/{team_a.slug}/sweeps/"
    assert api.get(f"{theirs}{sweep.pk}/").status_code in (403, 404)
    assert api.post(f"{theirs}{sweep.pk}/cancel/").status_code in (403, 404)
    # A's dataset version named in her own team: no such dataset.
    body = {
        "dataset_id": dataset.pk,
        "dataset_version": version.number,
        "space": {"dropout": {"low": 0.0, "high": 0.3}},
    }
    assert api.post(mine, body, content_type="application/json").status_code == 404
    console = Client(HTTP_ACCEPT_LANGUAGE="en")
    console.force_login(mallory)
    page = reverse("training:sweep", args=[team_b.slug, sweep.pk])
    assert console.get(page).status_code == 404
    cancel = reverse("training:sweep_cancel", args=[team_b.slug, sweep.pk])
    assert console.post(cancel).status_code == 404
    sweep.refresh_from_db()
    assert sweep.status == "running" and Sweep.objects.count() == 1
    assert not Sweep.objects.filter(team=team_b).exists()
