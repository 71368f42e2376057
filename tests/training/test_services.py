"""The job life cycle's rules without a worker: claims, attempts, the team limit, priorities,
cancel of a queued job, clone, validation; the model registry's archive round trip."""

import io
import json

import pytest
import redis
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from console import hardware
from console.services import node_register
from tests.helpers.models import stored_model
from training.jobs import (
    training_job_cancel,
    training_job_clone,
    training_job_retry,
    training_job_submit,
)
from training.models import ModelVersion, TrainingJob
from training.registry import model_version_archive, model_version_import
from training.scheduling import JobMustWait, training_job_claim, training_jobs_reconcile


@pytest.fixture
def version(make_dataset):
    return make_dataset()


@pytest.fixture(autouse=True)
def this_node(db):
    """This process claims jobs as the train worker of a node with four CPU slots."""
    devices = hardware.parse_devices("cpu:4")
    return node_register(name=settings.NODE_NAME, devices=devices, simulated=False)


def submit(owner, team, version, **kwargs) -> TrainingJob:
    return training_job_submit(actor=owner, team=team, dataset_version=version, **kwargs)


def test_a_job_takes_the_recommended_hyperparameters_and_given_ones(team, owner, version):
    job = submit(owner, team, version, hyperparameters={"epochs": 2, "seed": 7})
    # On a CPU, the kind's fast model; on an accelerator, a transformer.
    assert job.preset == "ngram-bag-char" and job.backend == "paddle"
    assert job.hyperparameters["epochs"] == 2 and job.hyperparameters["seed"] == 7
    # Early stopping is on unless asked otherwise; no time budget unless given one.
    assert job.hyperparameters["early_stopping_patience"] == 3
    assert job.hyperparameters["max_minutes"] == 0
    assert job.hyperparameters["learning_rate"] == 3e-3  # the fast preset's rate
    assert job.labels == ["正面", "负面"]
    assert job.status == "queued" and job.celery_task_id
    assert job.hyperparameters["amp"] is False  # not on a CPU
    gpu = submit(owner, team, version, device_type="gpu")
    assert gpu.hyperparameters["amp"] is True  # the gpu profile supports it
    assert gpu.preset == "ernie-tiny-char"
    torch = submit(owner, team, version, backend="torch")
    assert torch.preset == "ernie-micro-char"  # no fast model on torch


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hyperparameters": {"epochs": 0}}, "epochs ≥ 1"),
        ({"hyperparameters": {"epochs": 2.5}}, "whole number"),
        ({"hyperparameters": {"max_minutes": -1}}, "0 ≤ max_minutes ≤ 10080"),
        ({"hyperparameters": {"max_minutes": 10081}}, "0 ≤ max_minutes ≤ 10080"),
        (
            {"hyperparameters": {"learning_rate": "fast"}},
            "learning_rate must be a number, not 'fast'",
        ),
        ({"hyperparameters": {"momentum": 0.9}}, "unknown hyperparameter(s): momentum"),
        ({"device_type": "tpu"}, "unknown device type 'tpu'"),
        ({"backend": "jax"}, "No training backend named “jax”"),
        ({"preset": "gpt-5"}, "No preset named “gpt-5”"),
        ({"hyperparameters": {"amp": True}}, "Mixed precision (amp) is not supported on CPU"),
        ({"device_count": 0}, "A job needs at least one device."),
        ({"backend": "torch", "device_type": "npu"}, "The torch backend runs on CPUs and CUDA"),
    ],
)
def test_a_bad_spec_is_refused_with_the_reason(team, owner, version, changes, message):
    with pytest.raises(ValidationError) as exc:
        submit(owner, team, version, **changes)
    assert message in " ".join(exc.value.messages)
    assert not TrainingJob.objects.exists()


def test_a_queued_job_is_cancelled_at_once(team, owner, version):
    job = submit(owner, team, version)
    job = training_job_cancel(actor=owner, job=job)
    assert job.status == "cancelled" and job.finished_at
    # The worker that still receives its message does not run it.
    assert training_job_claim(job.pk, "w") is None
    with pytest.raises(ValidationError, match="nothing to cancel"):
        training_job_cancel(actor=owner, job=job)


def test_the_team_limit_keeps_a_job_waiting(team, owner, version, settings):
    settings.TRAINING_TEAM_CONCURRENCY = 1
    first, second = submit(owner, team, version), submit(owner, team, version)
    assert training_job_claim(first.pk, "w").status == "running"
    with pytest.raises(JobMustWait):
        training_job_claim(second.pk, "w")
    second.refresh_from_db()
    assert second.status == "queued" and "limit" in second.waiting


def test_a_job_whose_worker_was_lost_too_often_fails_with_the_reason(team, owner, version):
    job = submit(owner, team, version)
    TrainingJob.objects.filter(pk=job.pk).update(
        status="running",
        attempts=settings.TRAINING_MAX_ATTEMPTS,
        node="gone-node",
        heartbeat_at=timezone.now() - timezone.timedelta(minutes=5),
        worker="train@gone",
    )
    assert training_job_claim(job.pk, "w") is None
    job.refresh_from_db()
    assert job.status == "failed" and "lost 3 times" in job.error and "train@gone" in job.error


def test_a_job_running_elsewhere_is_left_alone(team, owner, version):
    job = submit(owner, team, version)
    TrainingJob.objects.filter(pk=job.pk).update(
        status="running", attempts=1, node="other-node", heartbeat_at=timezone.now()
    )
    assert training_job_claim(job.pk, "w") is None
    job.refresh_from_db()
    assert job.status == "running" and job.attempts == 1


def test_clone_changes_hyperparameters_and_keeps_the_rest(team, owner, version):
    job = submit(owner, team, version, hyperparameters={"epochs": 2}, priority=0)
    clone = training_job_clone(
        actor=owner, job=job, changes={"hyperparameters": {"learning_rate": 5e-4}}
    )
    assert clone.origin == job and clone.priority == 0
    assert clone.hyperparameters == {**job.hyperparameters, "learning_rate": 5e-4}
    with pytest.raises(ValidationError, match="Only a failed or cancelled job"):
        training_job_retry(actor=owner, job=job)


@pytest.mark.django_db(transaction=True)
def test_priorities_and_device_queues_route_the_message(
    team, owner, make_dataset, celery_worker_process
):
    """Each job goes to its device's queue; on Redis a priority is a list of its own, and the
    worker reads the lists most urgent first (kombu's priority steps, 0 first)."""
    version = make_dataset()
    r = redis.Redis.from_url(settings.REDIS_URL)
    lists = {0: "train.xpu", 5: "train.xpu:5", 9: "train.xpu:9"}
    r.delete(*lists.values())
    jobs = {p: submit(owner, team, version, device_type="xpu", priority=p) for p in (9, 0, 5)}
    try:
        for priority, key in lists.items():
            messages = [json.loads(m) for m in r.lrange(key, 0, -1)]
            assert [m["headers"]["id"] for m in messages] == [jobs[priority].celery_task_id]
    finally:
        r.delete(*lists.values())
        for job in jobs.values():
            training_job_cancel(actor=owner, job=job)


@pytest.mark.django_db(transaction=True)
def test_reconcile_requeues_a_job_whose_worker_stopped_beating_and_names_missing_queues(
    team, owner, make_dataset, celery_worker_process
):
    version = make_dataset()
    r = redis.Redis.from_url(settings.REDIS_URL)
    stale, waiting = (
        submit(owner, team, version, device_type="npu"),
        submit(owner, team, version, device_type="mlu"),
    )
    old_task = stale.celery_task_id
    TrainingJob.objects.filter(pk=stale.pk).update(
        status="running", attempts=1, heartbeat_at=timezone.now() - timezone.timedelta(minutes=5)
    )
    try:
        assert training_jobs_reconcile() == [stale.pk]
        stale.refresh_from_db()
        waiting.refresh_from_db()
        assert stale.celery_task_id != old_task
        ids = [json.loads(m)["headers"]["id"] for m in r.lrange("train.npu:5", 0, -1)]
        assert stale.celery_task_id in ids
        assert "no live node has a mlu device (queue train.mlu)" in waiting.waiting
    finally:
        r.delete("train.npu:5", "train.mlu:5")
        TrainingJob.objects.update(status="cancelled")


def test_a_model_version_travels_as_one_archive(team, owner, make_team, tmp_path):
    original = stored_model(team, owner, tmp_path)
    buf = io.BytesIO()
    model_version_archive(original, buf)
    elsewhere = make_team("Elsewhere", {owner: "owner"})
    copy = model_version_import(
        actor=owner, team=elsewhere, archive=SimpleUploadedFile("m.tar.gz", buf.getvalue())
    )
    assert copy.source == "imported" and copy.team == elsewhere
    assert copy.files == original.files and copy.manifest == original.manifest
    assert copy.metrics == {"accuracy": 0.9}
    assert copy.provenance["team"] == team.slug


def test_a_tampered_archive_is_refused(team, owner, tmp_path):
    import tarfile

    original = stored_model(team, owner, tmp_path)
    buf = io.BytesIO()
    model_version_archive(original, buf)
    buf.seek(0)
    out = io.BytesIO()
    with tarfile.open(fileobj=buf) as src, tarfile.open(fileobj=out, mode="w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name == "export/model.onnx":
                data = data.replace(b"really", b"REALLY")
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    with pytest.raises(ValidationError, match=r"model\.onnx does not match its sha256"):
        model_version_import(
            actor=owner, team=team, archive=SimpleUploadedFile("m.tar.gz", out.getvalue())
        )
    assert ModelVersion.objects.count() == 1


def test_an_archive_that_claims_a_target_it_lacks_imports_without_it(team, owner, tmp_path):
    # Another site's model.json says its ONNX target is ready; the archive holds no such files.
    claimed = {"targets": {"onnx": {"status": "ready", "agreement": 1.0}}}
    original = stored_model(team, owner, tmp_path, evaluation=claimed)
    buf = io.BytesIO()
    model_version_archive(original, buf)
    copy = model_version_import(
        actor=owner, team=team, archive=SimpleUploadedFile("m.tar.gz", buf.getvalue())
    )
    target = copy.evaluation["targets"]["onnx"]
    assert target["status"] == "failed" and "do not check out" in target["error"]
