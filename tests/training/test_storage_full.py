"""The disk of a job's work directory full while it writes a checkpoint: the job fails and
says so, and the checkpoint it wrote before is intact (a retry or a resume reads it)."""

import json
import os

import pytest
from django.db import transaction

from tests.helpers.jobs import wait_for
from tests.helpers.workers import start_train_worker, stop_worker
from training.jobs import training_job_submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_checkpoint_on_a_full_disk_fails_the_job_clearly_and_keeps_the_last_one(
    team, owner, make_dataset, small_disk, celery_worker_process
):
    version = make_dataset(n=60)
    # A node of its own (a simulated DCU: no other worker of the suite takes the job) whose
    # jobs work on the small disk.
    worker = start_train_worker(
        f"full-disk-{os.getpid()}", "dcu:1", {"TRAINING_WORK_DIR": str(small_disk.path)}
    )
    try:
        with transaction.atomic():
            job = training_job_submit(
                actor=owner,
                team=team,
                dataset_version=version,
                device_type="dcu",
                # The small transformer, not an accelerator's default: its checkpoints fit
                # the small disk until it is filled.
                preset="ernie-micro-char",
                hyperparameters={
                    "epochs": 200,
                    "early_stopping_patience": 0,
                    "batch_size": 8,
                    "max_seq_length": 32,
                    "checkpoint_steps": 3,
                },
            )
        job = wait_for(job, until=lambda j: j.events.filter(kind="checkpoint").count() >= 2)
        small_disk.fill()
        job = wait_for(job, timeout=120)
    finally:
        stop_worker(worker)
        small_disk.free()

    assert job.status == "failed"
    # The first write after the disk filled: a checkpoint, or the best model of an epoch.
    assert "No space left on device" in job.error, job.error
    assert "could not write the" in job.error and "is intact" in job.error, job.error
    # The last checkpoint the job reported is complete on the disk, as a resume reads it.
    last = job.events.filter(kind="checkpoint").last().data["step"]
    checkpoint = small_disk.path / "jobs" / str(job.pk) / "checkpoint"
    state = json.loads((checkpoint / "state.json").read_text())
    assert state["step"] == last
    assert all(f.stat().st_size > 0 for f in checkpoint.iterdir())
    assert not checkpoint.with_name("checkpoint.new").exists()
