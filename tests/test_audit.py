from django.urls import reverse

from console import services
from console.models import AuditEvent, Membership
from console.roles import Role


def test_login_and_failed_login_are_recorded_with_the_address(client, owner, team):
    client.post(
        reverse("console:login"),
        {"username": "olivia", "password": "wrong"},
        REMOTE_ADDR="10.1.2.3",
    )
    client.post(
        reverse("console:login"),
        {"username": "olivia", "password": "pw-Secret-123"},
        REMOTE_ADDR="10.1.2.4",
    )
    failed, login = AuditEvent.objects.order_by("id")
    assert (failed.action, failed.actor, failed.actor_username, failed.ip_address) == (
        "login.failed",
        None,
        "olivia",
        "10.1.2.3",
    )
    assert (login.action, login.actor, login.ip_address) == ("login", owner, "10.1.2.4")


def test_owner_sees_team_events_and_members_personal_ones(
    client, owner, team, make_user, make_team
):
    stranger = make_user("stranger", is_staff=True)  # who may create teams
    make_team("Elsewhere", {stranger: Role.OWNER})
    services.api_token_create(actor=stranger, name="not-yours")
    services.api_token_create(actor=owner, name="mine")
    services.team_create(actor=stranger, name="Far")
    client.force_login(owner)
    response = client.get(reverse("console:audit", kwargs={"team": team.slug}))
    shown = [(e.action, e.actor_username) for e in response.context["page"]]
    assert ("token.create", "olivia") in shown
    assert all(actor != "stranger" for _, actor in shown)


def test_audit_filters(client, owner, team, make_user):
    make_user("a1")
    make_user("a2")
    services.membership_add(actor=owner, team=team, username="a1", role="viewer")
    services.membership_add(actor=owner, team=team, username="a2", role="viewer")
    m = Membership.objects.get(user__username="a1")
    services.membership_change_role(actor=owner, membership=m, role="annotator")
    client.force_login(owner)
    url = reverse("console:audit", kwargs={"team": team.slug})

    def shown(**params):
        return [e.action for e in client.get(url, params).context["page"]]

    assert shown(action="membership.add") == ["membership.add", "membership.add"]
    assert shown(action="membership") == [
        "membership.role_change",
        "membership.add",
        "membership.add",
    ]
    assert shown(actor="nobody") == []
    assert shown(since="2000-01-01", until="2000-01-02") == []
    api = client.get(f"/api/v1/teams/{team.slug}/audit/", {"action": "membership.role"}).json()
    assert [e["data"] for e in api["results"]] == [
        {"username": "a1", "from": "viewer", "to": "annotator"}
    ]


def test_only_owners_see_the_audit_log(client, owner, team, make_user):
    maintainer = make_user("m")
    Membership.objects.create(team=team, user=maintainer, role=Role.MAINTAINER)
    client.force_login(maintainer)
    assert client.get(reverse("console:audit", kwargs={"team": team.slug})).status_code == 403
    page = client.get(reverse("console:dashboard", kwargs={"team": team.slug})).content.decode()
    assert reverse("console:audit", kwargs={"team": team.slug}) not in page


def test_account_administration_of_other_teams_does_not_leak(client, owner, team, make_user):
    """A site administrator who is only a viewer here: their account work elsewhere stays out."""
    admin = make_user("root", is_staff=True)
    Membership.objects.create(team=team, user=admin, role=Role.VIEWER)
    services.user_create(actor=admin, username="secret-person", password="Long-enough-pw-42")
    services.api_token_create(actor=admin, name="admin-token")
    client.force_login(owner)
    events = client.get(reverse("console:audit", kwargs={"team": team.slug})).context["page"]
    shown = {(e.action, e.actor_username) for e in events}
    assert ("token.create", "root") in shown
    assert not any(action == "user.create" for action, _ in shown)
