"""Domain-adaptive pretraining (objective "mlm") through the real train worker: a job that
pretrains a transformer preset on a version's texts ends with a base model of the team, checked
and stored as an import is, which the next job fine-tunes; what submission refuses."""

import hashlib

import pytest
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.urls import reverse

from tests.helpers.jobs import wait_for
from training.jobs import training_job_submit
from training.models import BaseModel, ModelVersion

TINY = {"epochs": 3, "batch_size": 16, "max_seq_length": 32, "learning_rate": 2e-3}


@pytest.mark.django_db(transaction=True)
def test_a_pretraining_job_makes_a_base_model_that_a_fine_tuning_job_takes(
    client, team, owner, make_dataset, train_worker
):
    version = make_dataset(n=80, name="reviews")
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        preset="ernie-micro-char",
        objective="mlm",
        hyperparameters=TINY,
    )
    assert job.name == "reviews-dapt" and job.labels == []
    job = wait_for(job)
    assert job.status == "succeeded", job.error
    assert not ModelVersion.objects.filter(job=job).exists()

    model = BaseModel.objects.get(job=job)
    assert (model.team, model.name, model.backend, model.architecture) == (
        team,
        "reviews-dapt",
        "paddle",
        "ernie",
    )
    files = model.manifest["files"]
    assert set(files) == {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"}
    for name, meta in files.items():
        with default_storage.open(model.storage_prefix + name, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == meta["sha256"]
    figures = model.summary["pretraining"]
    assert figures["texts"] == 80
    assert figures["metrics"]["mlm_loss"] < figures["initial"]["mlm_loss"]
    assert {"held_out", "dev"} & set(e.data.get("split") for e in job.events.filter(kind="metrics"))

    # The job page and the API show the result and its figures.
    client.force_login(owner)
    page = client.get(
        reverse("training:job", kwargs={"team": team.slug, "training_job_id": job.pk})
    )
    assert b'data-testid="mlm-figures"' in page.content and b"reviews-dapt" in page.content
    api = client.get(
        reverse("training:api_job", kwargs={"team": team.slug, "training_job_id": job.pk})
    ).json()
    assert api["objective"] == "mlm" and api["pretrained_model"] == "reviews-dapt"

    # Its name is taken now: a second pretraining must be named.
    with pytest.raises(ValidationError, match="reviews-dapt"):
        training_job_submit(actor=owner, team=team, dataset_version=version, objective="mlm")

    tuned = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        base_model="reviews-dapt",
        hyperparameters={**TINY, "epochs": 6},
    )
    tuned = wait_for(tuned)
    assert tuned.status == "succeeded", tuned.error
    assert tuned.model_version.base == "reviews-dapt"
    assert tuned.model_version.metrics["accuracy"] >= 0.8, tuned.model_version.metrics


@pytest.mark.django_db
def test_submission_refuses_what_pretraining_cannot_train(team, owner, make_dataset):
    version = make_dataset(n=20, name="short")
    for changes, message in (
        ({"backend": "torch"}, "paddle backend"),
        ({"preset": "ngram-bag-char"}, "transformer preset"),
        ({"device_count": 2}, "one device"),
        ({"objective": "clm"}, "Unknown objective"),
    ):
        fields = {"objective": "mlm", **changes}
        with pytest.raises(ValidationError, match=message):
            training_job_submit(actor=owner, team=team, dataset_version=version, **fields)


@pytest.mark.django_db
def test_the_job_form_and_the_api_submit_a_pretraining(client, team, owner, make_dataset):
    from training.models import TrainingJob

    version = make_dataset(n=20, name="notes")
    client.force_login(owner)
    form = client.get(reverse("training:job_new", kwargs={"team": team.slug}))
    assert b'name="objective"' in form.content and b'value="mlm"' in form.content
    response = client.post(
        reverse("training:job_new", kwargs={"team": team.slug}),
        {
            "dataset_version": version.pk,
            "backend": "paddle",
            "model": "preset:",
            "objective": "mlm",
            "device_type": "cpu",
            "device_count": 1,
            "priority": 5,
            "metric": "macro_f1",
            "name": "notes-lm",
        },
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    job = TrainingJob.objects.get(name="notes-lm")
    assert (job.objective, job.preset) == ("mlm", "ernie-micro-char")
    assert job.hyperparameters["epochs"] == 20 and job.hyperparameters["learning_rate"] == 1e-3

    api = client.post(
        reverse("training:api_jobs", kwargs={"team": team.slug}),
        {
            "dataset_id": version.dataset_id,
            "dataset_version": version.number,
            "objective": "mlm",
            "preset": "ernie-tiny-char",
        },
        content_type="application/json",
    )
    assert api.status_code == 201, api.content
    assert api.json()["objective"] == "mlm" and api.json()["name"] == "notes-dapt"
