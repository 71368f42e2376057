"""The nodes page and API: every node, its devices, what holds each (named to the holder's team
and to site administrators only), and which nodes stopped beating."""

import pytest
from django.utils import timezone

from console import hardware
from console.models import Node
from console.services import devices_acquire, node_register, node_stop


@pytest.fixture
def nodes(team):
    node_register(name="gpu-01", devices=hardware.parse_devices("cpu:1,gpu:2"), simulated=False)
    node_register(name="ascend-01", devices=hardware.parse_devices("npu:2"), simulated=True)
    node_register(name="old", devices=hardware.parse_devices("cpu:1"), simulated=False)
    Node.objects.filter(name="old").update(
        heartbeat_at=timezone.now() - timezone.timedelta(hours=2)
    )
    devices_acquire(
        node_name="ascend-01",
        device_type="npu",
        count=1,
        holder="training_job:7",
        label="#7 客服意图",
        team=team,
    )


def test_the_page_lists_nodes_devices_holders_and_stopped_heartbeats(client, owner, nodes):
    client.force_login(owner)
    client.cookies["django_language"] = "en"
    page = client.get("/nodes/").content.decode()
    for name in ("gpu-01", "ascend-01", "old"):
        assert f'data-node="{name}"' in page
    assert 'data-state="heartbeat-stopped"' in page and 'data-state="simulated"' in page
    assert "#7 客服意图" in page
    assert 'data-profile="npu"' in page and "ASCEND_RT_VISIBLE_DEVICES" in page
    node_stop("gpu-01")
    assert 'data-state="stopped"' in client.get("/nodes/").content.decode()


def test_another_team_sees_a_device_taken_but_not_by_what(client, make_user, nodes):
    client.force_login(make_user("outsider"))
    client.cookies["django_language"] = "en"
    page = client.get("/nodes/").content.decode()
    assert "客服意图" not in page and "a job of another team" in page
    held = [
        d["held_by"]
        for n in client.get("/api/v1/nodes/").json()["results"]
        for d in n["devices"]
        if d["held_by"]
    ]
    assert held == ["a job of another team"]


def test_the_api_names_the_holder_to_its_team_and_says_which_nodes_are_alive(client, owner, nodes):
    client.force_login(owner)
    listed = {n["name"]: n for n in client.get("/api/v1/nodes/").json()["results"]}
    assert listed["old"]["alive"] is False and listed["gpu-01"]["alive"] is True
    assert listed["ascend-01"]["simulated"] is True
    assert [
        (d["device_type"], d["index"], d["held_by"]) for d in listed["ascend-01"]["devices"]
    ] == [
        ("npu", 0, "#7 客服意图"),
        ("npu", 1, ""),
    ]
    assert listed["gpu-01"]["queues"] == ["train.cpu", "train.gpu"]


def test_nodes_need_a_login(client, nodes):
    assert client.get("/nodes/").status_code == 302
    assert client.get("/api/v1/nodes/").status_code in (401, 403)
