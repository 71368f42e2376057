"""The quality gate's comparison names a model version: another team's version cannot be
compared with an endpoint (its figures would leak), nor added to it, through the API or the
console's canary form; a 404, as for any object of another team."""

from django.urls import reverse

from console.roles import Role
from console.services import api_token_create
from deployment.models import Revision
from deployment.rollout import endpoint_deploy
from training.models import ModelVersion


def _version(team, owner, macro_f1: float) -> ModelVersion:
    return ModelVersion.objects.create(
        team=team,
        name="reviews",
        number=ModelVersion.objects.filter(team=team).count() + 1,
        task_kind="text_classification",
        labels=["正面", "负面"],
        backend="paddle",
        runtime="paddle_inference",
        evaluation={"split": "test", "rows": 20, "metrics": {"macro_f1": macro_f1}},
        storage_prefix=f"models/{team.slug}/",
        files={"export/manifest.json": {"sha256": "0" * 64, "size": 1}},
        created_by=owner,
    )


def test_another_teams_version_is_not_comparable(db, client, owner, team, make_user, make_team):
    endpoint = endpoint_deploy(
        actor=owner, team=team, model_version=_version(team, owner, 0.8), name="reviews"
    )
    rival = make_user("rival")
    theirs = _version(make_team("Beta", {rival: Role.OWNER}), rival, 0.95)
    _token, key = api_token_create(actor=owner, name="ci")
    base = f"/api/v1/teams/{team.slug}/endpoints/{endpoint.pk}/"
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"}

    r = client.get(base + f"compare/?model_version={theirs.pk}", **headers)
    assert r.status_code == 404 and "0.95" not in r.content.decode()
    r = client.post(
        base + "revisions/", {"model_version": theirs.pk}, "application/json", **headers
    )
    assert r.status_code == 404

    client.force_login(owner)
    r = client.post(
        reverse("deployment:endpoint_canary", args=[team.slug, endpoint.pk]),
        {
            "model_version": theirs.pk,
            "weight": 10,
            "device_type": "cpu",
            "replicas": 1,
            "max_batch_size": 32,
            "max_wait_ms": 5,
        },
        follow=True,
    )
    assert "0.95" not in r.content.decode()
    assert not Revision.objects.filter(model_version=theirs).exists()
