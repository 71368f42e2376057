"""The REST API and console pages of training, as a maintainer and a viewer see them."""

import pytest
from django.urls import reverse

from console.models import Membership
from console.roles import Role
from console.services import api_token_create
from tests.helpers.models import stored_model
from training.models import TrainingEvent, TrainingJob

EVALUATION = {
    "split": "test",
    "rows": 10,
    "metrics": {
        "accuracy": 0.8,
        "macro_f1": 0.79,
        "per_label": {
            "正面": {"precision": 0.8, "recall": 0.8, "f1": 0.8, "support": 5},
            "负面": {"precision": 0.8, "recall": 0.8, "f1": 0.8, "support": 5},
        },
        "confusion": {"labels": ["正面", "负面"], "matrix": [[4, 1], [1, 4]]},
        "support": 10,
    },
    "mistakes": [{"row": {"text": "还行吧", "label": "正面"}, "predicted": {"label": "负面"}}],
}


@pytest.fixture
def api(client, owner):
    _token, key = api_token_create(actor=owner, name="ci")
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return client


def test_the_api_submits_lists_clones_and_cancels_a_job(api, team, make_dataset):
    version = make_dataset()
    base = f"/api/v1/teams/{team.slug}/training-jobs/"
    response = api.post(
        base,
        {
            "dataset_id": version.dataset_id,
            "dataset_version": version.number,
            "hyperparameters": {"epochs": 2},
            "priority": 0,
        },
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["status"] == "queued" and job["hyperparameters"]["epochs"] == 2
    assert job["dataset_version"] == version.number and job["preset"] == "ernie-micro-char"
    assert [j["id"] for j in api.get(base).json()["results"]] == [job["id"]]

    TrainingEvent.objects.create(job_id=job["id"], kind="loss", data={"step": 1, "loss": 0.7})
    events = api.get(f"{base}{job['id']}/events/?after=0").json()
    assert events["job"]["id"] == job["id"] and events["events"][0]["data"]["loss"] == 0.7
    last = events["events"][-1]["id"]
    assert api.get(f"{base}{job['id']}/events/?after={last}").json()["events"] == []

    clone = api.post(
        f"{base}{job['id']}/clone/",
        {"hyperparameters": {"epochs": 4}},
        content_type="application/json",
    ).json()
    assert clone["origin"] == job["id"] and clone["hyperparameters"]["epochs"] == 4
    assert api.post(f"{base}{job['id']}/cancel/").json()["status"] == "cancelled"
    retry = api.post(f"{base}{job['id']}/retry/")
    assert retry.status_code == 201 and retry.json()["origin"] == job["id"]
    assert api.get(f"/api/v1/teams/{team.slug}/presets/").json()[0]["name"]


def test_a_viewer_reads_jobs_and_models_but_submits_nothing(client, team, make_user, make_dataset):
    viewer = make_user("vera")
    Membership.objects.create(team=team, user=viewer, role=Role.VIEWER)
    version = make_dataset()
    client.force_login(viewer)
    assert client.get(reverse("training:jobs", kwargs={"team": team.slug})).status_code == 200
    response = client.post(
        reverse("training:job_new", kwargs={"team": team.slug}),
        {"dataset_version": version.pk, "backend": "paddle", "model": "preset:ernie-micro-char"},
    )
    assert response.status_code == 403
    assert not TrainingJob.objects.exists()


def test_the_console_submits_a_job_and_shows_it(client, team, owner, make_dataset):
    version = make_dataset()
    client.force_login(owner)
    new_job = reverse("training:job_new", kwargs={"team": team.slug})
    page = client.get(new_job)
    assert "ernie-micro-char" in page.content.decode()
    form = {
        "dataset_version": version.pk,
        "backend": "paddle",
        "model": "preset:ernie-tiny-char",
        "device_type": "cpu",
        "device_count": 1,
        "priority": 5,
        "metric": "macro_f1",
    }
    response = client.post(new_job, {**form, "epochs": 3})
    job = TrainingJob.objects.get()
    assert response.status_code == 302 and response["Location"].endswith(f"/training/{job.pk}/")
    assert job.preset == "ernie-tiny-char" and job.hyperparameters["epochs"] == 3
    assert job.hyperparameters["batch_size"] == 16  # left empty: the recommended value
    body = client.get(response["Location"]).content.decode()
    assert job.name in body and 'data-status="queued"' in body
    assert "epochs=3" in body
    listing = client.get(reverse("training:jobs", kwargs={"team": team.slug})).content.decode()
    assert job.name in listing

    bad = client.post(new_job, {**form, "learning_rate": 3})
    assert "0 &lt; learning_rate &lt; 1" in bad.content.decode()


def test_the_evaluation_report_comparison_and_download(client, team, owner, tmp_path):
    first = stored_model(
        team,
        owner,
        tmp_path / "a",
        evaluation=EVALUATION,
        metrics={"accuracy": 0.8, "macro_f1": 0.79},
        hyperparameters={"epochs": 3},
    )
    second = stored_model(
        team,
        owner,
        tmp_path / "b",
        number=2,
        metrics={"accuracy": 0.9, "macro_f1": 0.88},
        hyperparameters={"epochs": 6},
    )
    client.force_login(owner)
    page = client.get(
        reverse("training:model", kwargs={"team": team.slug, "model_version_id": first.pk})
    )
    body = page.content.decode()
    assert 'data-testid="confusion"' in body and "rgba(20,86,240,0.8)" in body
    assert "还行吧" in body and 'data-metric="macro_f1"' in body
    compare = client.get(
        reverse("training:models_compare", kwargs={"team": team.slug}),
        {"ids": [first.pk, second.pk]},
    ).content.decode()
    assert "0.7900" in compare and "0.8800" in compare and "epochs" in compare
    download = client.get(
        reverse("training:model_download", kwargs={"team": team.slug, "model_version_id": first.pk})
    )
    assert download.status_code == 200
    assert download["Content-Disposition"].endswith('reviews-v1.tar.gz"')
    assert b"".join(download.streaming_content)[:2] == b"\x1f\x8b"


def test_the_base_models_page_lists_presets_and_refuses_a_bad_import(client, team, owner):
    client.force_login(owner)
    url = reverse("training:base_models", kwargs={"team": team.slug})
    assert "ernie-tiny-char" in client.get(url).content.decode()
    body = client.post(url, {"name": "x", "backend": "paddle", "path": "nowhere"}).content
    assert "does not exist on the server" in body.decode()


def test_a_multi_label_report_shows_each_labels_counts(client, team, owner, tmp_path):
    evaluation = {
        "split": "test",
        "rows": 4,
        "metrics": {
            "accuracy": 0.5,
            "label_confusion": {"物流": {"tp": 1, "fp": 0, "fn": 1, "tn": 2}},
            "support": 4,
        },
        "mistakes": [{"row": {"text": "到货慢", "labels": ["物流"]}, "predicted": {"labels": []}}],
    }
    model = stored_model(team, owner, tmp_path, task_kind="multi_label", evaluation=evaluation)
    client.force_login(owner)
    body = client.get(
        reverse("training:model", kwargs={"team": team.slug, "model_version_id": model.pk})
    ).content.decode()
    assert 'data-testid="label-confusion"' in body and "物流" in body
    assert "<td>到货慢</td><td>物流</td><td>∅</td>" in body
