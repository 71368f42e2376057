"""Training jobs through the real Celery train worker, Redis and the runner process (Paddle and
torch in the runtime venv): each task kind with each backend, cancel, a killed worker, retry."""

import html
import io
import json
import os
import signal
import subprocess
import tarfile
import time

import pytest
from django.core.files.storage import default_storage
from django.db import transaction
from django.urls import reverse

from tests.helpers.jobs import log_of, losses, wait_for
from training.jobs import training_job_cancel, training_job_retry, training_job_submit
from training.models import ModelVersion, TrainingJob
from training.registry import model_version_target_archive, model_version_targets
from training.supervision import job_workdir

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("train_worker")]

FAST = {"epochs": 6, "batch_size": 16, "max_seq_length": 32}
# The torch backend's transformer learns these rows in 6 epochs at twice its recommended rate;
# paddle's fast presets take their own.
RATE = {"torch": {"learning_rate": 2e-3}, "paddle": {}}


# Every kind through the worker and the registry with paddle; torch once (its every kind is
# trained, exported and evaluated in tests/runtime/test_torch_backend.py).
KINDS = ["text_classification", "multi_label", "ner", "text_pair"]


@pytest.mark.parametrize(
    ("kind", "backend"), [*((k, "paddle") for k in KINDS), ("text_classification", "torch")]
)
def test_each_task_kind_trains_with_each_backend(team, owner, make_dataset, kind, backend, client):
    version = make_dataset(kind)
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        backend=backend,
        hyperparameters={**FAST, **RATE[backend]},
    )
    job = wait_for(job)
    assert job.status == "succeeded", job.error
    assert job.step == job.total_steps > 0
    assert job.first_step_at and job.started_at <= job.first_step_at <= job.finished_at
    if (kind, backend) == ("text_classification", "paddle"):
        _the_panel_leaves_the_frameworks_warnings_to_the_full_log(client, owner, job)

    model = ModelVersion.objects.get(job=job)
    assert model.dataset_version == version and model.backend == backend
    assert model.runtime == {"paddle": "paddle_inference", "torch": "onnxruntime"}[backend]
    assert model.manifest["task_kind"] == kind and model.manifest["labels"] == job.labels
    for name, meta in model.files.items():
        assert default_storage.size(model.storage_prefix + name) == meta["size"]
    assert "export/manifest.json" in model.files and "checkpoint/vocab.txt" in model.files
    report = model.evaluation["metrics"]
    assert set(report["per_label"]) == set(job.labels)
    if kind in ("text_classification", "text_pair"):
        assert report["confusion"]["labels"][: len(job.labels)] == job.labels
        assert report["accuracy"] >= 0.8, report
    if kind == "ner":
        assert report["f1"] >= 0.5, report
    if kind == "multi_label":
        assert set(report["label_confusion"]) == set(job.labels)
    # Beside the model, the baselines trained on its train split and scored on the same rows.
    comparison = model.baseline_comparison
    assert comparison["model"] == report[comparison["metric"]]
    assert comparison["baseline"] is not None, model.evaluation["baselines"]
    assert {row["label"] for row in comparison["per_label"]} >= set(job.labels)
    # Its export targets: the export itself, and for a Paddle model its ONNX form, which
    # decided every test row as the export did; each downloads as a folder whose manifest
    # holds the sha256 of its files.
    targets = {t["name"]: t for t in model_version_targets(model)}
    assert next(iter(targets)) == {"paddle": "paddle_inference", "torch": "onnx"}[backend]
    assert all(t["status"] == "ready" for t in targets.values()), targets
    if backend == "paddle":
        assert targets["onnx"]["runtime"] == "onnxruntime"
        assert targets["onnx"]["agreement"] == 1.0, targets
    for name in targets:
        out = io.BytesIO()
        assert model_version_target_archive(model, name, out)
        out.seek(0)
        with tarfile.open(fileobj=out) as tf:
            manifest = json.load(tf.extractfile("manifest.json"))
            assert set(manifest["files"]) | {"manifest.json"} == set(tf.getnames())
    kinds = set(job.events.values_list("kind", flat=True))
    assert {"state", "loss", "metrics", "checkpoint"} <= kinds
    # The work directory is removed once the model is registered (just after the status).
    deadline = time.monotonic() + 30
    while job_workdir(job).exists():
        assert time.monotonic() < deadline, "the work directory was not removed"
        time.sleep(0.1)


def _runner_alive(job: TrainingJob) -> bool:
    found = subprocess.run(["pgrep", "-f", f"runtime.run {job_workdir(job)}$"], capture_output=True)
    return found.returncode == 0


def test_cancel_stops_a_running_job_within_seconds(team, owner, make_dataset):
    version = make_dataset(n=200)
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        hyperparameters={"epochs": 500, "early_stopping_patience": 0},
    )
    job = wait_for(job, until=lambda j: j.step > 0)
    assert _runner_alive(job)
    training_job_cancel(actor=owner, job=job)
    job = wait_for(job, timeout=10)
    assert job.status == "cancelled"
    assert not _runner_alive(job)
    assert not ModelVersion.objects.filter(job=job).exists()


def test_a_worker_killed_mid_job_resumes_from_its_checkpoint(team, owner, make_dataset):
    version = make_dataset(n=160)
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        # Every epoch (counted below): no early stopping.
        hyperparameters={
            "epochs": 12,
            "batch_size": 8,
            "checkpoint_steps": 5,
            "early_stopping_patience": 0,
        },
    )
    job = wait_for(job, until=lambda j: j.events.filter(kind="checkpoint").count() >= 3)
    killed_at = job.events.filter(kind="checkpoint").last().data["step"]
    os.kill(job.pid, signal.SIGKILL)  # the pool process running the job: the worker is lost

    job = wait_for(job, timeout=240)
    assert job.status == "succeeded", job.error
    assert job.attempts == 2
    resumed = job.events.get(kind="resumed")
    assert resumed.attempt == 2 and resumed.data["step"] >= killed_at > 0
    # The second attempt trained only the steps that were left: 12 epochs × 16 steps in all.
    assert job.step == job.total_steps == 12 * 16
    steps = [e.data["step"] for e in job.events.filter(kind="loss", attempt=2)]
    assert steps and min(steps) > resumed.data["step"]


def test_a_failed_job_says_why_and_is_retried_as_a_new_job(team, owner, make_dataset):
    version = make_dataset()
    with transaction.atomic():  # queued at commit, so the change below is seen by the worker
        job = training_job_submit(
            actor=owner, team=team, dataset_version=version, hyperparameters={"epochs": 1}
        )
        # A label set that lacks one of the data's labels: the runner fails, and says why.
        TrainingJob.objects.filter(pk=job.pk).update(labels=["正面", "中性"])
    job = wait_for(job)
    assert job.status == "failed"
    assert "KeyError" in job.error and "负面" in job.error

    retry = training_job_retry(actor=owner, job=job)
    assert retry.origin == job and retry.hyperparameters == job.hyperparameters
    retry = wait_for(retry)
    assert retry.status == "succeeded", retry.error


@pytest.mark.parametrize("backend", ["paddle", "torch"])
def test_two_cpu_processes_train_one_job_to_the_result_of_one_process(
    team, owner, make_dataset, backend
):
    """A job on two devices runs under its framework's launcher (Paddle's, or torchrun: two CPU
    processes, gloo): each trains on half of every batch and the gradients are averaged, so
    without dropout it ends where a single process ends."""
    version = make_dataset(n=80)
    hp = {"epochs": 4, "batch_size": 16, "dropout": 0.0, "learning_rate": 2e-3}
    one, two = (
        training_job_submit(
            actor=owner,
            team=team,
            dataset_version=version,
            backend=backend,
            preset="ernie-micro-char",  # the same model on one device and on two
            hyperparameters=hp,
            device_count=n,
        )
        for n in (1, 2)
    )
    one, two = wait_for(one), wait_for(two)
    assert one.status == two.status == "succeeded", (one.error, two.error)
    assert one.total_steps == two.total_steps
    launched = log_of(two)
    assert "2 processes train this job" in launched
    if backend == "paddle":
        assert "nproc_per_node: 2" in launched and "with_gloo: 1" in launched

    last = one.total_steps
    assert losses(two)[last] == pytest.approx(losses(one)[last], rel=1e-3, abs=1e-4)
    assert two.model_version.metrics["accuracy"] == pytest.approx(
        one.model_version.metrics["accuracy"], abs=0.05
    )


def _the_panel_leaves_the_frameworks_warnings_to_the_full_log(client, owner, job) -> None:
    """Paddle's own warnings (its C++ glog lines, Python warnings, PaddleNLP's logger) are in
    the job's full log, not in its page's panel; the runner's own lines are in both."""
    noise = [e.data["message"] for e in job.events.filter(kind="log", data__has_key="noise")]
    assert noise, "a Paddle job prints warnings: none was recognised"
    client.force_login(owner)
    page = client.get(reverse("training:job", args=[job.team.slug, job.pk])).content.decode()
    panel = page.split('data-testid="log">', 1)[1].split("</pre>", 1)[0]
    assert "training rows" in panel  # the runner's first line
    assert not any(html.escape(line) in panel for line in noise)
    full = client.get(reverse("training:job_log", args=[job.team.slug, job.pk]))
    assert full["Content-Disposition"] == f'attachment; filename="job-{job.pk}-log.txt"'
    text = b"".join(full.streaming_content).decode()
    assert "training rows" in text and all(line in text for line in noise)
