"""A job for two cards on two nodes of one card each (real train workers, as `make run` starts
them, with declared devices simulated on this CPU): each node runs its part under the
framework's launcher, and the job ends where one process ends. Its own module: the nodes of
``test_node_workers`` (module-scoped) would take these jobs."""

import pytest
from django.db import transaction

from console.models import Node
from tests.helpers.jobs import log_of, losses, wait_for
from tests.helpers.workers import start_train_worker, stop_worker
from training.jobs import training_job_submit
from training.models import TrainingJob

pytestmark = pytest.mark.django_db(transaction=True)

# The team may run all the jobs of a test at once.
TEAM_LIMIT = {"TRAINING_TEAM_CONCURRENCY": "4"}


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
