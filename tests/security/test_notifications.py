"""Notification channels as an insider tries them: a robot's address must be at an allowed
host (an owner cannot make the platform call its internal services), only owners add or delete
channels and only their own team's, a robot's token and secret are stored sealed and never
shown again, and another team's notifications stay its own."""

from django.urls import reverse

from console.models import NotificationChannel
from console.notifications import notify

TOKEN = "robot-access-token-0123456789"


def page(team) -> str:
    return reverse("console:notifications", args=[team.slug])


def test_a_robot_must_be_at_an_allowed_host(client, team, owner, settings):
    settings.NOTIFY_ROBOT_HOSTS = ["oapi.dingtalk.com"]
    client.force_login(owner)
    for target in (
        "http://127.0.0.1:8000/api/v1/teams/",  # the platform itself
        "http://10.0.0.5:6379/",  # an internal service
        "http://oapi.dingtalk.com.attacker.example/robot/send",
        "http://user@127.0.0.1/robot",
        "file:///etc/passwd",
    ):
        response = client.post(
            page(team),
            {"name": "x", "kind": "dingtalk", "target": target, "events": ["job_failed"]},
        )
        assert response.status_code == 200, target  # the form again, with the reason
        assert not NotificationChannel.objects.exists(), target
    response = client.post(
        page(team),
        {
            "name": "ok",
            "kind": "dingtalk",
            "target": f"https://oapi.dingtalk.com/robot/send?access_token={TOKEN}",
            "events": ["job_failed"],
        },
    )
    assert response.status_code == 302


def test_only_owners_manage_their_own_teams_channels(client, team, owner, make_user, make_team):
    victim = make_team("Victim", {make_user("victim-owner"): "owner"})
    channel = NotificationChannel.objects.create(
        team=victim, name="v", kind="email", target="boss@victim.example", events=["job_failed"]
    )
    client.force_login(owner)
    delete = reverse("console:notification_channel_delete", args=[team.slug, channel.pk])
    assert client.post(delete).status_code == 404
    assert client.get(page(victim)).status_code == 404
    maintainer = make_user("mia")
    team.memberships.create(user=maintainer, role="maintainer")
    client.force_login(maintainer)
    fields = {"name": "m", "kind": "email", "target": "m@example.com", "events": ["job_failed"]}
    assert client.post(page(team), fields).status_code == 403
    assert "boss@victim.example" not in client.get(page(team)).content.decode()
    assert NotificationChannel.objects.filter(team=team).count() == 0
    assert NotificationChannel.objects.filter(pk=channel.pk).exists()


def test_a_robots_token_and_secret_are_sealed_and_never_shown(client, team, owner, settings):
    settings.NOTIFY_ROBOT_HOSTS = ["oapi.dingtalk.com"]
    client.force_login(owner)
    client.post(
        page(team),
        {
            "name": "群",
            "kind": "dingtalk",
            "target": f"https://oapi.dingtalk.com/robot/send?access_token={TOKEN}",
            "secret": "SEC-signing-secret-42",
            "events": ["job_failed"],
        },
    )
    channel = NotificationChannel.objects.get()
    assert TOKEN not in channel.target and "SEC-signing-secret-42" not in channel.secret
    html = client.get(page(team)).content.decode()
    assert TOKEN not in html and "SEC-signing-secret-42" not in html
    assert "oapi.dingtalk.com" in html
    audit = client.get(reverse("console:audit", args=[team.slug])).content.decode()
    assert TOKEN not in audit


def test_another_teams_notifications_stay_its_own(client, team, owner, make_user, make_team):
    victim = make_team("Victim", {make_user("victim-owner"): "owner"})
    notify(victim, "job_failed", "secret-project 训练失败")
    client.force_login(owner)
    html = client.get(page(team)).content.decode()
    assert "secret-project" not in html
    dashboard = client.get(reverse("console:dashboard", args=[team.slug])).content.decode()
    assert 'data-testid="unread"' not in dashboard
