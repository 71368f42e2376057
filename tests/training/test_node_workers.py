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
from tests.helpers.jobs import log_of, losses, wait_for
from tests.helpers.workers import start_train_worker, stop_worker
from training.jobs import training_job_cancel, training_job_submit
from training.models import TrainingJob

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"epochs": 2, "batch_size": 16, "max_seq_length": 32}
# The team may run all the jobs of a test at once.
TEAM_LIMIT = {"TRAINING_TEAM_CONCURRENCY": "4"}


@pytest.fixture
def two_nodes(django_db_setup, celery_worker_process):
    """An Ascend node with two cards and a Kunlunxin node with one, simulated on this CPU."""
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
    node = Node.objects.get(name="kunlun-test")
    assert node.alive and node.queues == ["train.xpu"] and node.simulated
    # A node whose row went away (deleted, a database restored) registers again with its beat.
    node.delete()
    deadline = time.monotonic() + 30
    while not Node.objects.filter(name="kunlun-test", devices__device_type="xpu").exists():
        assert time.monotonic() < deadline, "the node did not register again"
        time.sleep(0.3)
    node = Node.objects.get(name="kunlun-test")
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


@pytest.fixture
def two_single_card_nodes(django_db_setup, celery_worker_process, request):
    """Two nodes with one card each (simulated) of the test's device type: a job for two cards
    spans both."""
    device = request.param
    procs = [start_train_worker(f"{device}-{i}", f"{device}:1", TEAM_LIMIT) for i in "ab"]
    yield device
    for proc in procs:
        if proc.poll() is None:
            stop_worker(proc)


@pytest.mark.parametrize(
    ("backend", "two_single_card_nodes"),
    [("paddle", "npu"), ("torch", "gpu")],  # torch runs on CUDA (and ROCm) builds only
    indirect=["two_single_card_nodes"],
)
def test_a_job_spans_two_nodes_and_ends_where_one_process_ends(
    team, owner, make_dataset, two_single_card_nodes, backend
):
    """Each node runs its part under the framework's launcher (--master/--nnodes), meeting at
    the first node; the processes share every batch and average the gradients (gloo), so
    without dropout the job ends where one process ends."""
    version = make_dataset(n=80)
    hp = {"epochs": 3, "batch_size": 16, "dropout": 0.0, "learning_rate": 2e-3}

    def run(count: int) -> TrainingJob:
        with transaction.atomic():
            job = training_job_submit(
                actor=owner,
                team=team,
                dataset_version=version,
                backend=backend,
                hyperparameters=hp,
                device_type=two_single_card_nodes,
                device_count=count,
            )
        return wait_for(job)

    one, spanning = run(1), run(2)
    assert one.status == spanning.status == "succeeded", (one.error, spanning.error)
    device = two_single_card_nodes
    assert sorted(p["node"] for p in spanning.placement) == [f"{device}-a", f"{device}-b"]
    assert spanning.placement[0]["node"] == spanning.node
    assert all(p["devices"] == [0] for p in spanning.placement)
    assert spanning.rendezvous.rpartition(":")[2].isdigit()
    log = log_of(spanning)
    assert "the job spans 2 nodes" in log and "2 processes train this job" in log
    assert one.total_steps == spanning.total_steps

    last = one.total_steps
    assert losses(spanning)[last] == pytest.approx(losses(one)[last], rel=1e-3, abs=1e-4)
    # Both nodes' cards are free again.
    assert (
        not Node.objects.filter(name__startswith="ascend-").filter(devices__holder__gt="").exists()
    )
