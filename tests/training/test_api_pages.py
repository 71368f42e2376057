"""The REST API and console pages of training, as a maintainer and a viewer see them."""

import io
import re
import tarfile

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
    assert job["dataset_version"] == version.number and job["preset"] == "ngram-bag-char"
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
    response = client.post(new_job, {**form, "epochs": 3, "max_minutes": 30})
    job = TrainingJob.objects.get()
    assert response.status_code == 302 and response["Location"].endswith(f"/training/{job.pk}/")
    assert job.preset == "ernie-tiny-char" and job.hyperparameters["epochs"] == 3
    assert job.hyperparameters["batch_size"] == 16  # left empty: the recommended value
    assert job.hyperparameters["max_minutes"] == 30  # a time budget
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
        hyperparameters={"epochs": 3, "seed": 42},
    )
    second = stored_model(
        team,
        owner,
        tmp_path / "b",
        number=2,
        metrics={"accuracy": 0.9, "macro_f1": 0.88},
        hyperparameters={"epochs": 6, "seed": 42},
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
    # A hyperparameter the same in both tells them not apart: counted, not listed.
    assert "seed" not in compare and 'data-testid="hp-same"' in compare
    download = client.get(
        reverse("training:model_download", kwargs={"team": team.slug, "model_version_id": first.pk})
    )
    assert download.status_code == 200
    assert download["Content-Disposition"].endswith('reviews-v1.tar.gz"')
    assert b"".join(download.streaming_content)[:2] == b"\x1f\x8b"
    # Its export target alone: the export's folder (manifest first-level), a 404 for one it
    # has not.
    assert 'data-target="onnx"' in body and 'data-testid="download-onnx"' in body
    url = reverse(
        "training:model_download", kwargs={"team": team.slug, "model_version_id": first.pk}
    )
    target = client.get(url, {"target": "onnx"})
    assert target["Content-Disposition"].endswith('reviews-v1-onnx.tar.gz"')
    with tarfile.open(fileobj=io.BytesIO(b"".join(target.streaming_content))) as tf:
        assert sorted(tf.getnames()) == ["manifest.json", "model.onnx", "vocab.txt"]
    assert client.get(url, {"target": "paddle_lite"}).status_code == 404


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


def test_a_report_of_many_labels_lists_its_largest_confusions_instead_of_the_matrix(
    client, team, owner, tmp_path
):
    """A version may have thousands of labels: the page draws the matrix up to 30 of them, and
    past that lists the off-diagonal cells with the most rows, largest first."""
    labels = [f"类{i}" for i in range(40)]
    matrix = [[10 if i == j else 0 for j in range(40)] for i in range(40)]
    matrix[3][7], matrix[5][2], matrix[8][8] = 6, 2, 30  # a diagonal cell is no confusion
    for i in range(10, 40):
        matrix[i][(i + 1) % 40] = 1
    evaluation = {
        "split": "test",
        "rows": 440,
        "metrics": {"accuracy": 0.9, "confusion": {"labels": labels, "matrix": matrix}},
        "mistakes": [],
    }
    model = stored_model(team, owner, tmp_path, evaluation=evaluation)
    client.force_login(owner)
    body = client.get(
        reverse("training:model", kwargs={"team": team.slug, "model_version_id": model.pk})
    ).content.decode()
    assert 'data-testid="confusion"' not in body and "Most frequent confusions" in body
    listed = re.findall(
        r"<tr><td>(类\d+)</td><td>(类\d+)</td><td>(\d+)</td><td>([\d.]+)</td></tr>", body
    )
    assert len(listed) == 20
    assert listed[:2] == [("类3", "类7", "6", "0.375"), ("类5", "类2", "2", "0.167")]
    # Ties in the matrix's order.
    assert listed[2:4] == [("类10", "类11", "1", "0.091"), ("类11", "类12", "1", "0.091")]


def _with_baselines(model_f1: float) -> dict:
    """A report as runtime.run writes it: the model's metrics, the baselines', the comparison."""
    per_label = {
        "正面": {"precision": 0.9, "recall": 0.9, "f1": 0.9, "support": 5},
        "负面": {"precision": 0.7, "recall": 0.7, "f1": 0.7, "support": 5},
    }
    majority = {"正面": {**per_label["正面"], "f1": 0.6667}, "负面": {**per_label["负面"], "f1": 0}}
    return {
        **EVALUATION,
        "metrics": {**EVALUATION["metrics"], "macro_f1": model_f1},
        "baselines": {
            "train_rows": 40,
            "majority": {"metrics": {"macro_f1": 0.333333, "per_label": majority}},
            "classical": {
                "name": "tfidf_char_lr",
                "train_s": 0.42,
                "metrics": {"macro_f1": 0.8, "per_label": per_label},
            },
        },
        "comparison": {
            "metric": "macro_f1",
            "model": model_f1,
            "baseline": 0.8,
            "majority": 0.333333,
            "beats_baseline": model_f1 > 0.8,
        },
    }


def test_a_model_below_its_baseline_is_flagged_on_every_page(api, client, team, owner, tmp_path):
    worse = stored_model(team, owner, tmp_path / "a", evaluation=_with_baselines(0.61))
    better = stored_model(team, owner, tmp_path / "b", number=2, evaluation=_with_baselines(0.93))
    old = stored_model(team, owner, tmp_path / "c", number=3, evaluation=EVALUATION)
    client.force_login(owner)

    def page(version) -> str:
        url = reverse("training:model", kwargs={"team": team.slug, "model_version_id": version.pk})
        return client.get(url).content.decode()

    body = page(worse)
    assert 'data-testid="baseline-warning"' in body and "does not beat its baseline" in body
    assert "macro_f1: this model 0.6100, the classical baseline 0.8000" in body
    assert 'data-testid="baseline-per-label"' in body and "tfidf_char_lr" in body
    # Per label: this model, the classical baseline, the majority guess, the support.
    assert "<td>负面</td><td>0.8000</td><td>0.7000</td><td>0.0000</td><td>5</td>" in body
    assert '<td data-baseline="classical">0.8000</td><td>0.4 s</td>' in body

    body = page(better)
    assert 'data-testid="baselines"' in body and 'data-testid="baseline-warning"' not in body
    assert '<td data-baseline="model">0.9300</td>' in body
    body = page(old)  # a report from before the baselines: nothing about them
    assert 'data-testid="baselines"' not in body and "baseline" not in body.lower()

    listing = client.get(reverse("training:models", kwargs={"team": team.slug})).content.decode()
    assert listing.count('data-testid="below-baseline"') == 1
    compare = client.get(
        reverse("training:models_compare", kwargs={"team": team.slug}),
        {"ids": [worse.pk, better.pk, old.pk]},
    ).content.decode()
    assert compare.count('data-testid="compare-baseline"') == 3 and "below baseline" in compare

    listed = api.get(f"/api/v1/teams/{team.slug}/models/").json()["results"]
    by_number = {m["number"]: m["baseline_comparison"] for m in listed}
    assert by_number[1]["beats_baseline"] is False and by_number[2]["beats_baseline"] is True
    assert by_number[3] is None
    assert by_number[1]["per_label"][1] == {
        "label": "负面",
        "model": 0.8,
        "baseline": 0.7,
        "majority": 0,
        "support": 5,
    }


def test_the_compress_form_says_what_was_wrong_and_queues_nothing(
    client, team, owner, tmp_path, make_dataset
):
    model = stored_model(team, owner, tmp_path, dataset_version=make_dataset())
    client.force_login(owner)
    url = reverse("training:model", kwargs={"team": team.slug, "model_version_id": model.pk})
    wrong = {
        "calibration_rows must be a number": (
            {"method": "int8", "mode": "static", "calibration_rows": "abc"},
            "Calibration rows must be a whole number, not “abc”.",
        ),
        "an unknown student": (
            {"method": "distill", "student": "nope"},
            "No student named “nope”",
        ),
        "student epochs must be a number": (
            {"method": "distill", "epochs": "many"},
            "Student epochs must be a whole number, not “many”.",
        ),
        "no student epochs": (
            {"method": "distill", "epochs": "0"},
            "epochs ≥ 1",
        ),
        "too many calibration rows": (
            {"method": "int8", "mode": "static", "calibration_rows": "999999"},
            "Calibration rows must be between 1 and 5000.",
        ),
    }
    for post, said in wrong.values():
        body = client.post(url, {"action": "compress", **post}, follow=True).content.decode()
        assert said in body, body[:2000]
    assert not TrainingJob.objects.exists()


def test_a_students_hyperparameters_are_taken_and_checked_as_a_jobs(
    client, team, owner, tmp_path, make_dataset
):
    model = stored_model(
        team,
        owner,
        tmp_path,
        dataset_version=make_dataset(),
        hyperparameters={"max_seq_length": 64},
    )
    _token, key = api_token_create(actor=owner, name="ci")
    url = f"/api/v1/teams/{team.slug}/models/{model.pk}/compress/"

    def compress(body: dict):
        return client.post(
            url, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
        )

    wrong = {
        "epochs ≥ 1": {"method": "distill", "hyperparameters": {"epochs": 0}},
        "unknown hyperparameter(s): nope": {"method": "distill", "hyperparameters": {"nope": 1}},
        "INT8 quantization trains nothing": {"method": "int8", "hyperparameters": {"epochs": 2}},
    }
    for said, body in wrong.items():
        response = compress(body)
        assert response.status_code == 400 and said in response.content.decode(), said
    assert not TrainingJob.objects.exists()
    body = {"method": "distill", "hyperparameters": {"epochs": 2, "learning_rate": 0.004}}
    response = compress(body)
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get()
    assert job.hyperparameters["epochs"] == 2 and job.hyperparameters["learning_rate"] == 0.004
    assert job.hyperparameters["max_seq_length"] == 64  # the teacher's, unless given
