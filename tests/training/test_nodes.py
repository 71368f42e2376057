"""Nodes and their devices, without workers: detection from the probe's facts, registration,
exclusive assignment, refusal of a job no node can hold, waiting reasons, the runner's view."""

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone, translation

from console import hardware
from console.models import Device, Node
from console.services import (
    DevicesBusy,
    devices_acquire,
    devices_release,
    node_register,
    node_stop,
)
from training.jobs import training_job_submit
from training.launch import runner_device, runner_env
from training.models import TrainingJob
from training.scheduling import (
    JobMustWait,
    device_holder,
    training_job_claim,
    training_job_release_devices,
    training_jobs_reconcile,
)


def register(name: str, devices: str, simulated: bool = True) -> Node:
    return node_register(name=name, devices=hardware.parse_devices(devices), simulated=simulated)


def submit(owner, team, version, **kwargs) -> TrainingJob:
    return training_job_submit(actor=owner, team=team, dataset_version=version, **kwargs)


def test_devices_are_found_by_each_profiles_detect_fact():
    facts = {
        "cpu": {"cores": 16, "memory": 64 << 30},
        "paddle": {
            "devices": [
                {"detect": "custom:npu", "index": 0, "name": "npu:0", "memory": None},
                {"detect": "custom:npu", "index": 1, "name": "npu:1", "memory": None},
                {"detect": "rocm", "index": 0, "name": "DCU Z100", "memory": 32 << 30},
                {"detect": "custom:unknown", "index": 0, "name": "x", "memory": None},
            ]
        },
        # torch sees the same ROCm card: counted once.
        "torch": {"devices": [{"detect": "rocm", "index": 0, "name": "Z100", "memory": 1}]},
    }
    found = hardware.devices_from_probe(facts, cpu_slots=2)
    assert [(d.device_type, d.index) for d in found] == [
        ("cpu", 0),
        ("cpu", 1),
        ("npu", 0),
        ("npu", 1),
        ("dcu", 0),
    ]
    assert found[0].name == "CPU (16 cores)" and found[4].memory == 32 << 30


def test_the_probe_here_finds_the_cpu_and_says_which_frameworks_it_saw():
    facts = hardware.probe(settings.TRAINING_PYTHON)
    assert "error" not in facts, facts
    assert facts["cpu"]["cores"] >= 1
    assert facts["paddle"]["version"].startswith("3.") and facts["paddle"]["cuda"] is False
    devices = hardware.devices_from_probe(facts)
    assert [d.device_type for d in devices] == ["cpu"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tpu:2", "unknown device type 'tpu'"),
        ("npu:x", "not <type>:<count>"),
        ("npu:0", "at least"),
    ],
)
def test_declared_devices_are_checked(text, message):
    with pytest.raises(ValueError, match=message):
        hardware.parse_devices(text)


def test_a_node_registered_again_keeps_what_its_devices_hold_and_forgets_lost_ones(team):
    register("n1", "npu:4")
    devices_acquire(node_name="n1", device_type="npu", count=3, holder="h", label="x", team=team)
    # A second worker under the same name (or --register-only) must not free busy cards.
    node = register("n1", "npu:2")
    assert node.queues == ["train.npu"] and node.alive
    assert list(node.devices.values_list("index", "holder")) == [(0, "h"), (1, "h")]


def test_devices_are_held_exclusively_and_released(team):
    register("n1", "npu:2")
    a = devices_acquire(
        node_name="n1", device_type="npu", count=1, holder="a:1", label="A", team=team
    )
    b = devices_acquire(
        node_name="n1", device_type="npu", count=1, holder="b", label="B", team=team
    )
    assert {a["n1"][0].index, b["n1"][0].index} == {0, 1}
    with pytest.raises(
        DevicesBusy, match="0 of 2 npu devices of node n1 are free, the job needs 1"
    ):
        devices_acquire(
            node_name="n1", device_type="npu", count=1, holder="c", label="C", team=team
        )
    # A job's next attempt gives back what its earlier attempts held first.
    again = devices_acquire(
        node_name="n1",
        device_type="npu",
        count=1,
        holder="a:2",
        replaces="a:",
        label="A",
        team=team,
    )
    assert again["n1"][0].index == a["n1"][0].index
    assert list(Device.objects.exclude(holder="").values_list("holder", flat=True)) == [
        "a:2",
        "b",
    ]


def test_a_job_that_spans_nodes_is_placed_all_at_once_or_not_at_all(team):
    for name in ("n1", "n2", "n3"):
        register(name, "npu:2")
    devices_acquire(node_name="n2", device_type="npu", count=1, holder="x", label="X", team=team)
    placed = devices_acquire(
        node_name="n1", device_type="npu", count=2, nodes=2, holder="j", label="J", team=team
    )
    # The asking node first, then the freest other (n2 has a card taken).
    assert {n: [d.index for d in ds] for n, ds in placed.items()} == {"n1": [0, 1], "n3": [0, 1]}
    # n2's free card alone cannot hold a part of two: the placement waits, holding nothing.
    with pytest.raises(DevicesBusy, match="spans 2 nodes with 1 free npu devices each; 1 have"):
        devices_acquire(
            node_name="n2", device_type="npu", count=1, nodes=2, holder="k", label="K", team=team
        )
    assert not Device.objects.filter(holder="k").exists()  # nothing half-placed


@pytest.mark.parametrize(
    ("counts", "n", "plan"),
    [
        ([4, 4], 4, (1, 4)),
        ([4, 4], 8, (2, 4)),
        ([2, 2, 2], 6, (3, 2)),
        ([4, 2], 6, None),  # no equal shares: 3 + 3 does not fit on the node of 2
        ([4, 4, 1], 6, (2, 3)),
        ([1], 2, None),
    ],
)
def test_a_job_spans_the_fewest_nodes_with_equal_shares(counts, n, plan):
    assert hardware.node_split(counts, n) == plan
    # A device type whose profile keeps jobs on one node.
    single = hardware.profile("mlu")
    assert hardware.placement_plan(single, counts, n) == ((1, n) if max(counts) >= n else None)


def test_a_job_no_set_of_nodes_can_hold_is_refused_with_the_reason(team, owner, make_dataset):
    version = make_dataset()
    register("small", "npu:2")
    register("big", "npu:4")
    with pytest.raises(ValidationError) as exc:
        submit(owner, team, version, device_type="npu", device_count=8)
    assert "cannot hold 8 Huawei Ascend NPU devices in equal shares" in " ".join(exc.value.messages)
    assert "small 2, big 4" in " ".join(exc.value.messages) or "big 4, small 2" in " ".join(
        exc.value.messages
    )
    assert submit(owner, team, version, device_type="npu", device_count=4).device_count == 4
    # Cambricon's profile keeps a job on one node.
    register("mlu-1", "mlu:2")
    register("mlu-2", "mlu:2")
    with pytest.raises(ValidationError, match=r"the most on one node is 2 \(mlu-1, mlu-2\)"):
        submit(owner, team, version, device_type="mlu", device_count=4)
    # A node whose heartbeat stopped does not count.
    Node.objects.filter(name="big").update(
        heartbeat_at=timezone.now() - timezone.timedelta(hours=1)
    )
    with pytest.raises(ValidationError, match="small 2"):
        submit(owner, team, version, device_type="npu", device_count=4)
    assert not TrainingJob.objects.exclude(device_count=4).exists()


def test_a_job_for_a_device_type_no_node_has_waits_with_that_reason(team, owner, make_dataset):
    version = make_dataset()
    job = submit(owner, team, version, device_type="xpu")
    assert job.waiting.startswith("Waiting: no live node has a xpu device (queue train.xpu)")
    register("kunlun", "xpu:8")
    training_jobs_reconcile()
    job.refresh_from_db()
    assert job.waiting_reason == ""
    node_stop("kunlun")
    training_jobs_reconcile()
    job.refresh_from_db()
    assert "no live node has a xpu device" in job.waiting


def test_why_a_job_waits_is_shown_in_the_readers_language(client, team, owner, make_dataset):
    """The worker stores the reason in no language: stored under Chinese, it reads in
    Chinese and in English (page and API) alike."""
    version = make_dataset()
    with translation.override("zh-hans"):
        job = submit(owner, team, version, device_type="xpu")
    client.force_login(owner)
    page = reverse("training:job", kwargs={"team": team.slug, "training_job_id": job.pk})
    api = f"/api/v1/teams/{team.slug}/training-jobs/{job.pk}/"
    client.post(reverse("set_language"), {"language": "zh-hans", "next": page})
    assert "没有在线节点" in client.get(page).content.decode()
    reason = client.get(api, HTTP_ACCEPT_LANGUAGE="zh-hans").json()["waiting_reason"]
    assert reason.startswith("等待中：没有在线节点")
    client.post(reverse("set_language"), {"language": "en", "next": page})
    english = client.get(page).content.decode()
    assert "Waiting: no live node has a xpu device (queue train.xpu)" in english
    assert "没有" not in english
    reason = client.get(api, HTTP_ACCEPT_LANGUAGE="en").json()["waiting_reason"]
    assert reason.startswith("Waiting: no live node has a xpu device")


def test_a_claimed_job_holds_its_cards_and_its_runner_sees_only_them(
    team, owner, make_dataset, settings
):
    settings.TRAINING_TEAM_CONCURRENCY = 5
    version = make_dataset()
    register(settings.NODE_NAME, "npu:4")
    first = submit(owner, team, version, device_type="npu")
    second = submit(owner, team, version, device_type="npu", device_count=2)
    first = training_job_claim(first.pk, "w")
    second = training_job_claim(second.pk, "w")
    assert first.devices == [0] and second.devices == [1, 2]
    env = runner_env(second)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "1,2"
    # A simulated node: the framework runs on the CPU underneath.
    assert runner_device(second) == "cpu"
    third = submit(owner, team, version, device_type="npu", device_count=2)
    with pytest.raises(JobMustWait):
        training_job_claim(third.pk, "w")
    third.refresh_from_db()
    assert "1 of 4 npu devices of node" in third.waiting
    training_job_release_devices(second)
    assert training_job_claim(third.pk, "w").devices == [1, 2]


def test_reconcile_frees_the_devices_of_jobs_that_ended_without_releasing(
    team, owner, make_dataset
):
    version = make_dataset()
    register(settings.NODE_NAME, "cpu:2")
    job = training_job_claim(submit(owner, team, version).pk, "w")
    assert Device.objects.filter(holder=device_holder(job)).count() == 1
    TrainingJob.objects.filter(pk=job.pk).update(status="failed")  # its worker was killed
    # Just taken: perhaps by a claim that committed after the beat read the running jobs.
    training_jobs_reconcile()
    assert Device.objects.exclude(holder="").count() == 1
    Device.objects.update(held_since=timezone.now() - timezone.timedelta(minutes=2))
    training_jobs_reconcile()
    assert not Device.objects.exclude(holder="").exists()


def test_a_job_taken_again_after_its_worker_died_waits_queued_when_its_cards_are_busy(
    team, owner, make_dataset
):
    version = make_dataset()
    register(settings.NODE_NAME, "npu:1")
    job = submit(owner, team, version, device_type="npu")
    TrainingJob.objects.filter(pk=job.pk).update(
        status="running",
        attempts=1,
        node="gone",
        heartbeat_at=timezone.now() - timezone.timedelta(minutes=5),
    )
    devices_acquire(
        node_name=settings.NODE_NAME, device_type="npu", count=1, holder="o", label="O", team=team
    )
    with pytest.raises(JobMustWait):
        training_job_claim(job.pk, "w")
    job.refresh_from_db()
    assert job.status == "queued" and job.attempts == 1 and "0 of 1 npu" in job.waiting
    devices_release("o")
    job = training_job_claim(job.pk, "w")
    assert job.attempts == 2 and job.devices == [0]
    assert Device.objects.get().holder == device_holder(job) == f"training_job:{job.pk}:2"


def test_a_job_sees_its_cards_through_the_workers_own_visibility(
    team, owner, make_dataset, monkeypatch
):
    """Cards 0-3 kept for the serving host: the worker sees 4-7 as its 0-3."""
    version = make_dataset()
    register(settings.NODE_NAME, "gpu:4")
    job = training_job_claim(
        submit(owner, team, version, device_type="gpu", device_count=2).pk, "w"
    )
    assert job.devices == [0, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert runner_env(job)["CUDA_VISIBLE_DEVICES"] == "4,5"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert runner_env(job)["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_a_card_that_fails_leaves_the_registry_at_the_next_detection(team, monkeypatch):
    """The heartbeat detects again: what the probe reports now (a fake probe here: this
    machine has no cards) becomes the node's devices; a failed probe changes nothing."""
    from console.services import node_redetect

    def facts(cards: int) -> dict:
        gpu = [
            {"detect": "cuda", "index": i, "name": "A800", "memory": 80 << 30} for i in range(cards)
        ]
        return {"cpu": {"cores": 8}, "paddle": {"devices": gpu}, "torch": {}}

    start = hardware.devices_from_probe(facts(2))
    node_register(name="gpu-node", devices=start, simulated=False, address="10.0.0.5")
    monkeypatch.setattr(hardware, "probe", lambda python: facts(1))
    now = node_redetect("gpu-node", start, address="10.0.0.5")
    assert [(d.device_type, d.index) for d in now] == [("cpu", 0), ("gpu", 0)]
    node = Node.objects.get(name="gpu-node")
    assert list(node.devices.values_list("device_type", "index")) == [("cpu", 0), ("gpu", 0)]
    assert node.address == "10.0.0.5" and node.facts["paddle"]["devices"][0]["name"] == "A800"
    monkeypatch.setattr(hardware, "probe", lambda python: {"error": "probe timed out"})
    assert node_redetect("gpu-node", now, address="10.0.0.5") == now


def test_a_cpu_job_for_more_slots_than_the_nodes_have_says_how_to_get_them(
    team, owner, make_dataset
):
    version = make_dataset()
    register("workstation", "cpu:1")
    with pytest.raises(ValidationError, match="PLATFORM_CPU_SLOTS devices"):
        submit(owner, team, version, device_count=2)
