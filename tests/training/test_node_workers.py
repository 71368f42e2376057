"""Several nodes, each a real train worker started as `make run` starts it (manage.py
train_worker) with declared devices: jobs go to the node that has their device type, two jobs
never share a card and each runner sees only its own, and a node whose heartbeat stopped is
shown so and gets no work."""

import os
import signal
import time

import pytest
from django.db import transaction

from console.models import Node
from tests.helpers.jobs import log_of, wait_for
from tests.helpers.workers import start_train_worker, stop_worker
from training.jobs import training_job_cancel, training_job_submit
from training.models import TrainingJob

# Its module-scoped fixtures: the module runs whole in one process of the suite (Makefile).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("node-workers")]

FAST = {"epochs": 2, "batch_size": 16, "max_seq_length": 32}
# The team may run all the jobs of a test at once.
TEAM_LIMIT = {"TRAINING_TEAM_CONCURRENCY": "4"}


@pytest.fixture(scope="module")
def two_nodes(django_db_setup, celery_worker_process):
    """An Ascend node with two cards and a Kunlunxin node with one, simulated on this CPU; one
    pair for the module (the heartbeat test, last, kills the Kunlunxin node)."""
    npu = start_train_worker("ascend-test", "npu:2", TEAM_LIMIT)
    xpu = start_train_worker("kunlun-test", "xpu:1", TEAM_LIMIT)
    yield npu, xpu
    for proc in (npu, xpu):
        if proc.poll() is None:
            stop_worker(proc)


def submit(owner, team, version, **kwargs) -> TrainingJob:
    with transaction.atomic():
        return training_job_submit(
            actor=owner, team=team, dataset_version=version, hyperparameters=FAST, **kwargs
        )


def registered(name: str) -> Node:
    """The node, once its beat has registered it (with its devices)."""
    deadline = time.monotonic() + 30
    while not Node.objects.filter(name=name, devices__isnull=False).exists():
        assert time.monotonic() < deadline, f"{name} did not register again"
        time.sleep(0.3)
    return Node.objects.get(name=name)


def overlap(a: TrainingJob, b: TrainingJob) -> bool:
    return a.started_at < b.finished_at and b.started_at < a.finished_at


def test_jobs_go_to_the_node_of_their_device_and_hold_their_cards_alone(
    team, owner, make_dataset, two_nodes
):
    version = make_dataset(n=60)
    one, two = (
        submit(owner, team, version, device_type="npu"),
        submit(owner, team, version, device_type="npu"),
    )
    kunlun = submit(owner, team, version, device_type="xpu")
    # Both cards of the Ascend node run a job each, so a job for both waits for them.
    wait_for(one, until=lambda j: j.status != "queued")
    wait_for(two, until=lambda j: j.status != "queued")
    both = submit(owner, team, version, device_type="npu", device_count=2)
    jobs = [wait_for(job) for job in (one, two, kunlun, both)]
    assert [j.status for j in jobs] == ["succeeded"] * 4, [j.error for j in jobs]
    one, two, kunlun, both = jobs

    assert {one.node, two.node, both.node} == {"ascend-test"} and kunlun.node == "kunlun-test"
    assert sorted(one.devices + two.devices) == [0, 1] and both.devices == [0, 1]
    assert overlap(one, two)  # the node ran them at once, each on its card
    assert not overlap(both, one) and not overlap(both, two)
    # The runner's own view: only its cards, through the profile's visibility variable, and
    # the CPU underneath (the node is simulated).
    assert f"devices: cpu via ASCEND_RT_VISIBLE_DEVICES={one.devices[0]}" in log_of(one)
    assert "devices: cpu via XPU_VISIBLE_DEVICES=0" in log_of(kunlun)
    assert "nproc_per_node: 2" in log_of(both)
    # Every card is free again.
    assert not Node.objects.get(name="ascend-test").devices.exclude(holder="").exists()


def test_a_node_whose_heartbeat_stopped_is_shown_so_and_its_jobs_wait(
    team, owner, make_dataset, two_nodes, settings, client
):
    settings.NODE_STALE_S = 3
    _npu, xpu = two_nodes
    node = registered("kunlun-test")  # the last test's flush deleted its row
    assert node.alive and node.queues == ["train.xpu"] and node.simulated
    # A node whose row went away (deleted, a database restored) registers again with its beat.
    node.delete()
    node = registered("kunlun-test")
    os.kill(xpu.pid, signal.SIGKILL)  # the machine is gone: no clean shutdown
    xpu.wait()
    wait_for(node, timeout=30, until=lambda n: not n.alive)

    client.force_login(owner)
    page = client.get("/nodes/").content.decode()
    card = page[page.index('data-node="kunlun-test"') :][:400]
    assert 'data-state="heartbeat-stopped"' in card

    version = make_dataset(n=40)
    job = submit(owner, team, version, device_type="xpu")
    assert "no live node has a xpu device (queue train.xpu)" in job.waiting
    # The Ascend node still beats and takes its jobs.
    assert Node.objects.get(name="ascend-test").alive
    training_job_cancel(actor=owner, job=job)
