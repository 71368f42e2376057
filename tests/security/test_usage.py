"""Usage and quotas as an insider tries them: a team owner cannot set quotas, nor see another
team's device time (its jobs' names included)."""

from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from console.models import DeviceUse


def use(team, label: str) -> None:
    now = timezone.now()
    DeviceUse.objects.create(
        team=team, team_name=team.name, holder=f"h-{label}", label=label, device_type="gpu",
        devices=1, started_at=now - timezone.timedelta(hours=1), ended_at=now,
    )  # fmt: skip


def test_an_owner_neither_sets_quotas_nor_sees_another_teams_usage(
    client, team, owner, make_user, make_team
):
    victim = make_team("Victim", {make_user("victim-owner"): "owner"})
    use(team, "#1 mine")
    use(victim, "#2 secret-project")
    api = APIClient()
    api.force_authenticate(owner)
    assert (
        api.post("/api/v1/quotas/", {"team": team.slug, "max_concurrent_jobs": 99}).status_code
        == 403
    )
    assert api.get("/api/v1/quotas/").status_code == 403
    team.refresh_from_db()
    assert team.max_concurrent_jobs is None
    assert api.get(f"/api/v1/teams/{victim.slug}/usage/").status_code == 404
    mine = api.get(f"/api/v1/teams/{team.slug}/usage/").json()
    assert [r["job"] for r in mine["by_job"]] == ["#1 mine"]
    client.force_login(owner)
    assert client.get(reverse("console:site_usage")).status_code == 404
    assert client.post(reverse("console:site_usage"), {"team": team.slug}).status_code == 404
    assert client.get(reverse("console:usage", args=[victim.slug])).status_code == 404
    csv = client.get(reverse("console:usage", args=[team.slug]) + "?format=csv").content.decode()
    assert "#1 mine" in csv and "secret-project" not in csv


def test_a_runner_cannot_turn_the_pause_request_into_a_write_elsewhere(
    tmp_path, team, owner, make_user
):
    """The worker asks a job to pause by creating a file in the runner's own work directory:
    a link the runner put there in advance is never followed (nothing is created at its
    target), and the pause is still asked for."""
    from labeling.datasets import dataset_create
    from tests.helpers.data import version_for
    from training.jobs import training_job_submit
    from training.supervision import _Supervisor

    team.device_hours_quota = {"cpu": 0}  # used up
    team.save()
    dataset = dataset_create(actor=owner, team=team, name="d", task_kind="text_classification")
    job = training_job_submit(actor=owner, team=team, dataset_version=version_for(dataset, owner))
    target = tmp_path / "outside" / "made-by-the-platform"
    target.parent.mkdir()
    workdir = tmp_path / "job"
    workdir.mkdir()
    (workdir / "pause-requested").symlink_to(target)
    supervisor = _Supervisor(job)
    supervisor.workdir = workdir
    supervisor.check_quota()
    assert supervisor.pausing
    assert not target.exists() and (workdir / "pause-requested").is_symlink()
