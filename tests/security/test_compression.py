"""Compression and export targets, attacked: a member of another team cannot compress a
team's model version or download its targets and edge bundles (404, as for everything of
another team), a viewer cannot queue a compression (403), and sizes an attacker picks are
bounded."""

import pytest
from django.test import Client

from console.roles import Role
from console.services import api_token_create
from tests.helpers.models import stored_model
from training.models import TrainingJob

pytestmark = pytest.mark.django_db


def _api(user) -> Client:
    _token, key = api_token_create(actor=user, name="t")
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_ACCEPT_LANGUAGE="en")


def test_another_team_and_a_viewer_cannot_compress_a_model(make_user, make_team, tmp_path):
    alice, mallory, victor = make_user("alice"), make_user("mallory"), make_user("victor")
    team_a = make_team("Alpha", {alice: Role.OWNER, victor: Role.VIEWER})
    team_b = make_team("Bravo", {mallory: Role.OWNER})
    model = stored_model(team_a, alice, tmp_path)

    body = {"mode": "dynamic"}
    mine = f"/api/v1/teams/{team_b.slug}/models/{model.pk}/compress/"
    assert _api(mallory).post(mine, body, content_type="application/json").status_code == 404
    theirs = f"/api/v1/teams/{team_a.slug}/models/{model.pk}/compress/"
    assert _api(mallory).post(theirs, body, content_type="application/json").status_code == 404
    assert _api(victor).post(theirs, body, content_type="application/json").status_code == 403
    # The owner's own request, with a calibration size past the limit: refused, said why.
    too_many = {"mode": "static", "calibration_rows": 10**9}
    response = _api(alice).post(theirs, too_many, content_type="application/json")
    assert response.status_code == 400 and "calibration_rows" in response.content.decode()
    assert not TrainingJob.objects.exists()


def test_another_team_downloads_no_target_or_edge_bundle(make_user, make_team, tmp_path):
    alice, mallory = make_user("alice"), make_user("mallory")
    team_a = make_team("Alpha", {alice: Role.OWNER})
    team_b = make_team("Bravo", {mallory: Role.OWNER})
    model = stored_model(team_a, alice, tmp_path)
    for team in (team_a, team_b):
        url = f"/api/v1/teams/{team.slug}/models/{model.pk}/download/"
        for query in ({"target": "onnx"}, {"target": "onnx", "bundle": "edge"}):
            assert _api(mallory).get(url, query).status_code == 404
    # Its owner gets both; a target it lacks is a 404 too.
    url = f"/api/v1/teams/{team_a.slug}/models/{model.pk}/download/"
    assert _api(alice).get(url, {"target": "onnx", "bundle": "edge"}).status_code == 200
    assert _api(alice).get(url, {"target": "paddle_lite", "bundle": "edge"}).status_code == 404


def test_a_student_is_never_another_teams_base_model(make_user, make_team, tmp_path):
    from labeling.datasets import dataset_create
    from tests.helpers.data import version_for
    from training.models import BaseModel

    alice, mallory = make_user("alice"), make_user("mallory")
    team_a = make_team("Alpha", {alice: Role.OWNER})
    team_b = make_team("Bravo", {mallory: Role.OWNER})
    dataset = dataset_create(actor=alice, team=team_a, name="r", task_kind="text_classification")
    model = stored_model(team_a, alice, tmp_path, dataset_version=version_for(dataset, alice, 40))
    BaseModel.objects.create(
        team=team_b,
        name="bravo-encoder",
        backend="paddle",
        architecture="ernie",
        manifest={"files": {}},
        storage_prefix="base_models/bravo/",
        created_by=mallory,
    )
    url = f"/api/v1/teams/{team_a.slug}/models/{model.pk}/compress/"
    body = {"method": "distill", "student": "bravo-encoder"}
    response = _api(alice).post(url, body, content_type="application/json")
    assert response.status_code == 400, response.content
    said = response.content.decode()
    assert "No student named" in said and "imported as a base model (none)" in said
    assert not TrainingJob.objects.exists()


def test_the_compare_page_is_bounded_and_shows_only_the_teams_versions(
    make_user, make_team, tmp_path
):
    alice, mallory = make_user("alice"), make_user("mallory")
    team_a = make_team("Alpha", {alice: Role.OWNER})
    team_b = make_team("Bravo", {mallory: Role.OWNER})
    theirs = stored_model(team_a, alice, tmp_path / "a")
    mine = [stored_model(team_b, mallory, tmp_path / f"b{i}", number=i + 1) for i in range(13)]
    client = Client(HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(mallory)
    url = f"/t/{team_b.slug}/models/compare/"
    assert client.get(url, {"ids": [mine[0].pk, theirs.pk]}).status_code == 404
    # Thirteen versions: twelve shown, and said so; a number of 5,000 digits is no id.
    response = client.get(url, {"ids": [m.pk for m in mine] + ["9" * 5000]})
    assert response.status_code == 200
    assert len(response.context["versions"]) == 12
    assert "At most 12 versions are compared" in response.content.decode()
