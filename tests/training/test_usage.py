"""Usage accounting and quotas: device time recorded from the devices' holds, added up by team,
user and job against holds of known duration; a team past its device-hours or its jobs at once
waits, saying why."""

import csv
import io
import time

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from console import hardware, usage
from console.models import Device, DeviceUse
from console.services import devices_acquire, devices_release, node_register
from tests.helpers.data import version_for
from training.jobs import training_job_submit
from training.scheduling import JobMustWait, training_job_claim

HOUR = timezone.timedelta(hours=1)


def register(name: str, devices: str):
    return node_register(name=name, devices=hardware.parse_devices(devices), simulated=True)


def hold(team, user, holder: str, label: str, count: int, hours_ago: float) -> None:
    devices_acquire(
        node_name="n1", device_type="npu", count=count, holder=holder, label=label, team=team,
        user=user,
    )  # fmt: skip
    Device.objects.filter(holder=holder).update(held_since=timezone.now() - hours_ago * HOUR)


def team_version(team, owner):
    from labeling.datasets import dataset_create

    dataset = dataset_create(actor=owner, team=team, name="d", task_kind="text_classification")
    return version_for(dataset, owner, 80)


def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "en"
    return client


def test_device_hours_add_up_from_holds_of_known_duration(client, team, owner, make_user):
    register("n1", "npu:4")
    other = make_user("wang")
    hold(team, owner, "training_job:1:1", "#1 评论分类", count=2, hours_ago=2)
    devices_release("training_job:1:1")  # two cards for two hours: 4 device-hours
    hold(team, other, "training_job:2:1", "#2 实体识别", count=1, hours_ago=0.5)  # still running
    use = DeviceUse.objects.get()
    assert (use.team, use.user, use.devices, use.label) == (team, owner, 2, "#1 评论分类")
    assert use.device_hours == pytest.approx(4, abs=0.01)

    figures = api(owner).get(f"/api/v1/teams/{team.slug}/usage/").json()
    (npu,) = figures["device_hours"]
    assert npu["device_type"] == "npu" and npu["hours"] == pytest.approx(4.5, abs=0.01)
    by_user = {r["username"]: r["hours"] for r in figures["by_user"]}
    assert by_user == {"olivia": pytest.approx(4, abs=0.01), "wang": pytest.approx(0.5, abs=0.01)}
    assert {r["job"] for r in figures["by_job"]} == {"#1 评论分类", "#2 实体识别"}

    client.force_login(owner)
    page = client.get(reverse("console:usage", args=[team.slug])).content.decode()
    assert "4.50" in page and "#2 实体识别" in page
    response = client.get(reverse("console:usage", args=[team.slug]) + "?format=csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode("utf-8-sig"))))
    assert sum(float(r["device_hours"]) for r in rows) == pytest.approx(4.5, abs=0.01)
    assert {r["user"] for r in rows} == {"olivia", "wang"}


def test_a_use_across_two_months_is_split_between_them(team, owner):
    start = usage.month_start()
    DeviceUse.objects.create(
        team=team, team_name=team.name, holder="h", label="#9 跨月", device_type="gpu",
        devices=2, started_at=start - HOUR, ended_at=start + 3 * HOUR,
    )  # fmt: skip
    previous = usage.month_start(start - timezone.timedelta(days=1))
    assert usage.device_hours_used(team, "gpu", start) == pytest.approx(6)
    assert usage.device_hours_used(team, "gpu", previous) == pytest.approx(2)
    figures = api(owner).get(f"/api/v1/teams/{team.slug}/usage/?month={previous:%Y-%m}").json()
    assert figures["device_hours"][0]["hours"] == pytest.approx(2)
    assert api(owner).get(f"/api/v1/teams/{team.slug}/usage/?month=2026-13").status_code == 400


def test_a_team_past_its_device_hours_waits_saying_why_until_staff_raise_them(
    team, owner, make_user, make_dataset
):
    register(settings.NODE_NAME, "npu:4")
    staff = make_user("site-admin", is_staff=True)
    answer = api(staff).post(
        "/api/v1/quotas/", {"team": team.slug, "device_hours_quota": {"npu": 1}}, format="json"
    )
    assert answer.status_code == 200 and answer.json()["device_hours_quota"] == {"npu": 1.0}
    DeviceUse.objects.create(
        team=team, team_name=team.name, holder="h", label="#0", device_type="npu", devices=3,
        started_at=timezone.now() - HOUR / 2, ended_at=timezone.now(),
    )  # fmt: skip
    job = training_job_submit(
        actor=owner, team=team, dataset_version=make_dataset(), device_type="npu"
    )
    with pytest.raises(JobMustWait):
        training_job_claim(job.pk, "w")
    job.refresh_from_db()
    reset = usage.next_month(usage.month_start()).date().isoformat()
    assert "1.5 of its 1 npu device-hours" in job.waiting and reset in job.waiting
    assert job.status == "queued"
    api(staff).post(
        "/api/v1/quotas/", {"team": team.slug, "device_hours_quota": {"npu": 10}}, format="json"
    )
    assert training_job_claim(job.pk, "w").status == "running"


def test_a_teams_own_jobs_at_once(team, owner, make_user, make_dataset, settings):
    settings.TRAINING_TEAM_CONCURRENCY = 5
    register(settings.NODE_NAME, "npu:4")
    staff = make_user("site-admin", is_staff=True)
    api(staff).post("/api/v1/quotas/", {"team": team.slug, "max_concurrent_jobs": 1}, format="json")
    version = make_dataset()
    first, second = (
        training_job_submit(actor=owner, team=team, dataset_version=version, device_type="npu")
        for _ in range(2)
    )
    training_job_claim(first.pk, "w")
    with pytest.raises(JobMustWait):
        training_job_claim(second.pk, "w")
    second.refresh_from_db()
    assert "runs 1 jobs, its limit" in second.waiting


def test_staff_set_quotas_in_the_console_and_bad_ones_are_refused(client, team, make_user):
    staff = make_user("site-admin", is_staff=True)
    client.force_login(staff)
    client.cookies["django_language"] = "en"
    url = reverse("console:site_usage")
    client.post(url, {"team": team.slug, "max_concurrent_jobs": "3", "hours_gpu": "120"})
    team.refresh_from_db()
    assert (team.max_concurrent_jobs, team.device_hours_quota) == (3, {"gpu": 120.0})
    page = client.post(url, {"team": team.slug, "hours_gpu": "-5"}, follow=True).content.decode()
    assert "greater than or equal to 0" in page
    team.refresh_from_db()
    assert team.device_hours_quota == {"gpu": 120.0}
    bad = api(staff).post(
        "/api/v1/quotas/", {"team": team.slug, "device_hours_quota": {"tpu": 5}}, format="json"
    )
    assert bad.status_code == 400 and "Unknown device type" in str(bad.json())


@pytest.fixture
def heavy_and_light(team, owner, make_user, make_team, make_dataset, settings):
    """One node with one npu; ``team`` used npu for 9 hours today, the team "Light" not at
    all; each has a job queued for it: (heavy job, light job, light team)."""
    settings.TRAINING_TEAM_CONCURRENCY = 5
    register(settings.NODE_NAME, "npu:1")
    light_owner = make_user("light")
    light = make_team("Light", {light_owner: "owner"})
    DeviceUse.objects.create(
        team=team, team_name=team.name, holder="h", label="#0", device_type="npu", devices=1,
        started_at=timezone.now() - 10 * HOUR, ended_at=timezone.now() - HOUR,
    )  # fmt: skip
    heavy_job = training_job_submit(
        actor=owner, team=team, dataset_version=make_dataset(), device_type="npu"
    )
    light_job = training_job_submit(
        actor=light_owner, team=light, dataset_version=team_version(light, light_owner),
        device_type="npu",
    )  # fmt: skip
    return heavy_job, light_job, light


def test_fair_share_the_team_that_used_less_lately_goes_first(heavy_and_light):
    heavy_job, light_job, _light = heavy_and_light
    # The heavy team's job is delivered first, and lets the light team's go first.
    with pytest.raises(JobMustWait):
        training_job_claim(heavy_job.pk, "w")
    heavy_job.refresh_from_db()
    assert "fair share" in heavy_job.waiting
    assert training_job_claim(light_job.pk, "w").status == "running"
    # Once the light team's job runs, the heavy one waits for the device, not for its turn;
    # with no other team waiting, it takes the device when it is free.
    with pytest.raises(JobMustWait):
        training_job_claim(heavy_job.pk, "w")
    heavy_job.refresh_from_db()
    assert "fair share" not in heavy_job.waiting
    devices_release(Device.objects.get(holder__startswith=f"training_job:{light_job.pk}").holder)
    assert training_job_claim(heavy_job.pk, "w").status == "running"


def test_fair_share_never_holds_a_job_for_one_that_could_not_start(heavy_and_light):
    heavy_job, _light_job, light = heavy_and_light
    light.device_hours_quota = {"npu": 0}  # the light team may not use npu at all this month
    light.save()
    assert training_job_claim(heavy_job.pk, "w").status == "running"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("train_worker")
def test_a_running_job_past_its_device_hours_pauses_at_its_epoch_end_and_resumes(
    team, owner, make_user, make_dataset
):
    """The suite's train worker runs the job (a CPU of its node): the team may use 0.002
    CPU device-hours (7 s) this month; the job crosses them while it trains, finishes its
    epoch, keeps its checkpoint in storage and waits, and resumes from it once staff raise
    the quota, losing no step."""
    from django.core.files.storage import default_storage

    from console.models import AuditEvent, Notification
    from tests.helpers.jobs import wait_for

    staff = make_user("site-admin", is_staff=True)
    quota = {"team": team.slug, "device_hours_quota": {"cpu": 0.002}}
    assert api(staff).post("/api/v1/quotas/", quota, format="json").status_code == 200
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=make_dataset(n=160),
        hyperparameters={"epochs": 30, "batch_size": 8, "early_stopping_patience": 0},
    )
    # Paused, then its devices given back (the worker releases them once the pause is stored).
    held = Device.objects.filter(holder__startswith=f"training_job:{job.pk}:")
    job = wait_for(job, until=lambda j: j.paused_at is not None and not held.exists(), timeout=240)
    assert job.status == "queued", job.error
    paused = job.events.get(kind="paused")
    per_epoch = job.total_steps // job.epochs
    assert paused.data["step"] == paused.data["epoch"] * per_epoch > 0  # at an epoch's end
    # The worker's words (in the site's language): the quota and the day it resets.
    reset = usage.next_month(usage.month_start()).date().isoformat()
    assert "0.002" in job.waiting and reset in job.waiting
    assert default_storage.exists(job.resume_prefix + "checkpoint/state.json")
    assert not Device.objects.filter(holder__startswith=f"training_job:{job.pk}:").exists()
    assert AuditEvent.objects.filter(action="training.job_paused", target_id=str(job.pk)).exists()
    # Its owners were told as the quota neared its end (once this month).
    assert Notification.objects.filter(team=team, event="quota_nearly_used").count() == 1
    used = DeviceUse.objects.filter(holder__startswith=f"training_job:{job.pk}:").get()
    assert used.device_hours >= 0.002

    time.sleep(3)  # the claim keeps it waiting while the quota is used
    job.refresh_from_db()
    assert job.status == "queued" and job.attempts == 1

    quota["device_hours_quota"] = {"cpu": 10}
    api(staff).post("/api/v1/quotas/", quota, format="json")
    job = wait_for(job, timeout=240)
    assert job.status == "succeeded", job.error
    resumed = job.events.get(kind="resumed")
    assert resumed.attempt == 2 and resumed.data["step"] == paused.data["step"]
    assert job.step == job.total_steps  # every step, none trained twice
    steps = [e.data["step"] for e in job.events.filter(kind="loss", attempt=2)]
    assert steps and min(steps) > paused.data["step"]
    assert job.resume_files == {} and job.paused_at is None and job.paused_s > 0
    assert not default_storage.exists(job.resume_prefix + "checkpoint/state.json")
