"""Compression through the real train worker: a Paddle model trained from the API, then
compressed to INT8 and distilled into a student from the API; each result is a new version
whose parent is the trained one, evaluated on the same test rows and shown beside its parent
on its page."""

import pytest
from django.urls import reverse

from console.services import api_token_create
from tests.helpers.jobs import wait_for
from training.base_models import base_model_import
from training.compression import compression_submit
from training.jobs import training_job_clone, training_job_submit
from training.models import ModelVersion, TrainingJob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("train_worker")]


def test_a_trained_model_compresses_to_int8_and_distills_into_a_student(
    client, team, owner, make_dataset, paddle_base
):
    version = make_dataset("text_classification", n=120)
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        hyperparameters={"epochs": 4, "batch_size": 16, "max_seq_length": 32},
    )
    job = wait_for(job)
    assert job.status == "succeeded", job.error
    parent = ModelVersion.objects.get(job=job)

    _token, key = api_token_create(actor=owner, name="ci")
    api = f"/api/v1/teams/{team.slug}/models/{parent.pk}/compress/"
    response = client.post(
        api,
        {"mode": "dynamic"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 201, response.content
    assert response.json()["objective"] == "int8"
    assert response.json()["parent_version"] == parent.pk
    compress = wait_for(TrainingJob.objects.get(pk=response.json()["id"]))
    assert compress.status == "succeeded", compress.error

    child = ModelVersion.objects.get(job=compress)
    assert child.parent == parent and child.name == parent.name
    assert child.number == parent.number + 1 and child.base == parent.base
    assert child.runtime == "onnxruntime" and child.manifest["quantization"] == "int8-dynamic"
    figures = child.compression
    assert figures["method"] == "int8" and figures["params"] == {"mode": "dynamic"}
    assert figures["agreement"] >= 0.9, figures
    assert abs(figures["metric_delta"]["accuracy"]) <= 0.05, figures
    assert figures["size"]["model"] < 0.5 * figures["size"]["parent_onnx"], figures
    assert child.evaluation["rows"] == parent.evaluation["rows"]

    # Its page: beside its parent, with the sizes and timings of each.
    client.force_login(owner)
    page = client.get(
        reverse("training:model", kwargs={"team": team.slug, "model_version_id": child.pk})
    ).content.decode()
    assert 'data-testid="compression"' in page and 'data-testid="parent"' in page
    assert "this version (INT8)" in page and 'data-metric="accuracy"' in page
    # A quantized version is not quantized again, and its job is redone from the page.
    with pytest.raises(Exception, match="compressed already"):
        compression_submit(actor=owner, version=child)
    with pytest.raises(Exception, match="started again from its model version"):
        training_job_clone(actor=owner, job=compress, changes={})

    # Distilled: a student preset learns what the parent decides, and is scored beside it.
    response = client.post(
        api,
        {"method": "distill", "student": "ngram-bag-char"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 201, response.content
    distill = wait_for(TrainingJob.objects.get(pk=response.json()["id"]))
    assert distill.status == "succeeded", distill.error
    student = ModelVersion.objects.get(job=distill)
    assert student.parent == parent and student.base == "ngram-bag-char"
    figures = student.compression
    assert figures["method"] == "distill" and figures["params"]["student"] == "ngram-bag-char"
    assert figures["params"]["rows"] >= parent.evaluation["rows"]
    assert figures["agreement"] >= 0.8 and set(figures["latency"]) == {"model", "parent"}
    page = client.get(
        reverse("training:model", kwargs={"team": team.slug, "model_version_id": student.pk})
    ).content.decode()
    assert "this version (the student)" in page

    # All three on one page: the parent's page links to it; metrics, per-label F1, how each
    # was made, and each one's size and timings (the parent's as its children measured it).
    page = client.get(
        reverse("training:model", kwargs={"team": team.slug, "model_version_id": parent.pk})
    ).content.decode()
    assert 'data-testid="compare-family"' in page
    assert f"ids={parent.pk}&amp;ids={child.pk}&amp;ids={student.pk}" in page
    compare = reverse("training:models_compare", kwargs={"team": team.slug})
    response = client.get(compare, {"ids": [parent.pk, child.pk, student.pk]})
    page = response.content.decode()
    assert response.status_code == 200
    made = response.context["deployment"]
    assert [d["method"] for _v, d in made] == ["", "int8", "distill"]
    assert all(d["b1_ms"] and d["b32_rows_per_s"] and d["size"] for _v, d in made), made
    assert made[0][1]["b1_ms"] == student.compression["latency"]["parent"]["b1_ms"]  # latest
    assert made[1][1]["agreement"] == child.compression["agreement"]
    assert page.count('data-testid="compare-b32"') == 3
    assert all(f'data-label="{label}"' in page for label in parent.labels)

    # A smaller imported encoder as the student: offered on the page, fine-tuned on what the
    # teacher decides, named in its lineage.
    base_model_import(actor=owner, team=team, name="ernie-mini", path=paddle_base.name)
    page = client.get(
        reverse("training:model", kwargs={"team": team.slug, "model_version_id": parent.pk})
    ).content.decode()
    assert '<option value="ernie-mini">' in page
    response = client.post(
        api,
        {"method": "distill", "student": "ernie-mini"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 201, response.content
    distill = wait_for(TrainingJob.objects.get(pk=response.json()["id"]))
    assert distill.status == "succeeded", distill.error
    assert distill.base_model.name == "ernie-mini" and not distill.preset
    mini = ModelVersion.objects.get(job=distill)
    assert mini.parent == parent and mini.base == "ernie-mini"
    assert mini.compression["params"]["student"] == "ernie-mini"
    # Scored beside its teacher (this test's encoder has random weights: no quality to expect).
    assert 0 <= mini.compression["agreement"] <= 1 and mini.evaluation["rows"] > 0
    # A student that is neither: the error lists what there is.
    with pytest.raises(Exception, match=r"ernie-micro-char.*ernie-mini"):
        compression_submit(actor=owner, version=parent, method="distill", student="gpt-9")
