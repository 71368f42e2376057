"""The quality gate of a rollout (deployment.quality): a canary or a promotion shows the new
model version beside the serving one, from their evaluation reports, and warns when it is worse,
on the console's pages and in the API's answers; a worse version deployed is in the audit log.
Model versions here are rows with the runner's report (no training, no serving host: on-commit
reconciliation never runs in a `db` test)."""

import pytest
from django.urls import reverse

from console.models import AuditEvent
from console.services import api_token_create
from deployment.models import Revision
from deployment.quality import WORSE_TOLERANCE, compare_versions
from deployment.rollout import endpoint_deploy, revision_add
from tests.helpers.data import make_version, reviews_dataset
from training.models import ModelVersion

LABELS = ["正面", "负面"]


@pytest.fixture(autouse=True)
def english(settings):
    settings.LANGUAGE_CODE = "en"


def report(macro_f1: float | None, f1s: tuple[float, float] = (0.9, 0.8), split="test") -> dict:
    """An evaluation report as the runner writes it (the figures that matter here)."""
    metrics = {"accuracy": 0.9, "per_label": {}}
    if macro_f1 is not None:
        metrics["macro_f1"] = macro_f1
    for label, f1 in zip(LABELS, f1s, strict=True):
        metrics["per_label"][label] = {"precision": f1, "recall": f1, "f1": f1, "support": 10}
    return {"split": split, "rows": 20, "metrics": metrics}


@pytest.fixture
def dataset_version(team, owner):
    return make_version(reviews_dataset(team, owner), owner)


@pytest.fixture
def version(team, owner):
    def make(evaluation: dict, dataset_version=None, kind="text_classification", team=team):
        number = ModelVersion.objects.filter(team=team, name="reviews").count() + 1
        return ModelVersion.objects.create(
            team=team,
            name="reviews",
            number=number,
            dataset_version=dataset_version,
            task_kind=kind,
            labels=LABELS,
            backend="paddle",
            runtime="paddle_inference",
            evaluation=evaluation,
            storage_prefix=f"models/{team.slug}-{number}/",
            files={"export/manifest.json": {"sha256": "0" * 64, "size": 1}},
            created_by=owner,
        )

    return make


def test_a_worse_candidate_on_the_same_split(db, version, dataset_version):
    serving = version(report(0.85, (0.9, 0.8)), dataset_version)
    candidate = version(report(0.80, (0.95, 0.65)), dataset_version)
    c = compare_versions(serving, candidate)
    assert c["metric"] == "macro_f1"
    assert (c["serving"]["value"], c["candidate"]["value"]) == (0.85, 0.80)
    assert c["delta"] == pytest.approx(-0.05)
    assert c["same_split"] is True and c["caveat"] == ""
    assert c["worse"] is True and c["tolerance"] == WORSE_TOLERANCE
    assert c["per_label"] == [
        {"label": "正面", "serving": 0.9, "candidate": 0.95, "delta": pytest.approx(0.05)},
        {"label": "负面", "serving": 0.8, "candidate": 0.65, "delta": pytest.approx(-0.15)},
    ]
    # The other way round it is better; within the tolerance it is not worse.
    assert compare_versions(candidate, serving)["worse"] is False
    close = version(report(0.85 - WORSE_TOLERANCE / 2), dataset_version)
    assert compare_versions(serving, close)["worse"] is False


def test_different_splits_compare_with_a_caveat(db, version, dataset_version):
    serving = version(report(0.85), dataset_version)
    elsewhere = version(report(0.70))  # another dataset version (here: none, imported)
    c = compare_versions(serving, elsewhere)
    assert c["same_split"] is False and c["worse"] is True
    assert "different test splits" in c["caveat"]
    # The same dataset version but one evaluated on dev (no test split): not the same rows.
    dev = version(report(0.9, split="dev"), dataset_version)
    assert compare_versions(serving, dev)["same_split"] is False


def test_nothing_to_compare(db, version, dataset_version):
    serving = version(report(0.85), dataset_version)
    unevaluated = version({}, dataset_version)
    c = compare_versions(serving, unevaluated)
    assert c["candidate"]["value"] is None and c["delta"] is None and c["worse"] is False
    assert "no evaluation" in c["caveat"]
    # A generative model has no primary metric; versions of different kinds do not compare.
    chat = version({"split": "test", "metrics": {"loss": 1.0}}, kind="instruction")
    assert compare_versions(chat, chat) is None
    assert compare_versions(serving, version(report(0.9), kind="text_pair")) is None


@pytest.fixture
def deployed(owner, team, version, dataset_version):
    """An endpoint serving a version at macro F1 0.85; a worse and a better candidate."""
    serving = version(report(0.85), dataset_version)
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=serving, name="reviews")
    worse = version(report(0.70, (0.8, 0.6)), dataset_version)
    better = version(report(0.90, (0.95, 0.85)), dataset_version)
    return endpoint, worse, better


@pytest.fixture
def api(client, owner):
    _token, key = api_token_create(actor=owner, name="ci")
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "en"
    return client


def test_the_api_answers_a_canary_and_a_promotion_with_the_comparison(db, api, team, deployed):
    endpoint, worse, better = deployed
    base = f"/api/v1/teams/{team.slug}/endpoints/{endpoint.pk}/"
    # Before: the preview of a version beside the serving one.
    r = api.get(base + f"compare/?model_version={worse.pk}")
    assert r.status_code == 200 and r.json()["comparison"]["worse"] is True
    assert api.get(base + "compare/").status_code == 400
    assert api.get(base + "compare/?model_version=999999").status_code == 404

    r = api.post(base + "revisions/", {"model_version": better.pk}, "application/json")
    assert r.status_code == 201, r.content
    c = r.json()["comparison"]
    assert c["worse"] is False and c["delta"] == pytest.approx(0.05) and c["same_split"]
    assert [row["label"] for row in c["per_label"]] == LABELS
    event = AuditEvent.objects.filter(action="endpoint.canary").latest("id")
    assert "worse_than_serving" not in event.data

    # A worse canary is not refused: the answer says so, and so does the audit log.
    r = api.post(base + "revisions/", {"model_version": worse.pk}, "application/json")
    assert r.status_code == 201 and r.json()["comparison"]["worse"] is True
    event = AuditEvent.objects.filter(action="endpoint.canary").latest("id")
    assert event.data["worse_than_serving"] is True
    assert (event.data["serving_value"], event.data["candidate_value"]) == (0.85, 0.70)

    r = api.post(base + f"revisions/{r.json()['id']}/promote/")
    assert r.status_code == 200 and r.json()["comparison"]["worse"] is True
    assert r.json()["stable_revision"] == Revision.objects.get(model_version=worse).pk
    event = AuditEvent.objects.filter(action="endpoint.promote").latest("id")
    assert event.data["worse_than_serving"] is True


def test_the_canary_form_warns_of_a_worse_version_before_it_is_added(
    db, client, owner, team, deployed
):
    client.force_login(owner)
    endpoint, worse, better = deployed
    canary_url = reverse("deployment:endpoint_canary", args=[team.slug, endpoint.pk])
    page_url = reverse("deployment:endpoint", args=[team.slug, endpoint.pk])
    form = {"weight": 10, "device_type": "cpu", "replicas": 1, "max_batch_size": 32}
    form["max_wait_ms"] = 5

    # A worse version: the comparison and the warning first, nothing added yet.
    r = client.post(canary_url, {**form, "model_version": worse.pk})
    body = r.content.decode()
    assert r.status_code == 200 and 'data-testid="worse-warning"' in body
    assert "This version is worse than the one the endpoint serves." in body
    assert "0.7000" in body and "0.8500" in body and "-0.1500" in body  # macro F1 and delta
    assert not Revision.objects.filter(model_version=worse).exists()
    # Confirmed: added; the endpoint's page shows the running canary beside the serving one,
    # with the warning, and asks before promoting it.
    r = client.post(canary_url, {**form, "model_version": worse.pk, "confirm_worse": "1"})
    assert r.status_code == 302 and Revision.objects.filter(model_version=worse).exists()
    body = client.get(page_url).content.decode()
    assert 'data-testid="comparison" data-worse="true"' in body
    assert 'data-testid="worse-warning"' in body
    assert "Promote it anyway?" in body
    client.post(reverse("deployment:endpoint_rollback", args=[team.slug, endpoint.pk]))

    # A better version: added at once, no warning anywhere.
    r = client.post(canary_url, {**form, "model_version": better.pk})
    assert r.status_code == 302 and Revision.objects.filter(model_version=better).exists()
    body = client.get(page_url).content.decode()
    assert 'data-testid="comparison" data-worse="false"' in body
    assert 'data-testid="worse-warning"' not in body and "Promote it anyway?" not in body
    assert "+0.0500" in body


def test_a_canary_of_an_endpoint_that_serves_nothing_has_no_comparison(db, owner, team, deployed):
    endpoint, worse, _better = deployed
    endpoint.revisions.update(status=Revision.Status.RETIRED, weight=0)
    endpoint.stable_revision = None
    endpoint.save(update_fields=["stable_revision"])
    assert revision_add(actor=owner, endpoint=endpoint, model_version=worse).comparison is None
