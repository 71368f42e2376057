import re

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from console import services
from console.models import AuditEvent, Membership
from console.roles import Role

pytestmark = pytest.mark.usefixtures("english")


def actions(team=None) -> list[str]:
    events = AuditEvent.objects.order_by("id")
    if team is not None:
        events = events.filter(team=team)
    return list(events.values_list("action", flat=True))


def test_team_create_makes_the_creator_owner(owner, settings):
    settings.PLATFORM_TEAM_CREATION = "any"
    team = services.team_create(actor=owner, name="Risk Models")
    assert team.slug == "risk-models"
    assert Membership.objects.get(team=team, user=owner).role == Role.OWNER
    assert actions(team) == ["team.create"]


def test_team_slugs_stay_unique_and_chinese_names_work(owner, settings):
    settings.PLATFORM_TEAM_CREATION = "any"
    a = services.team_create(actor=owner, name="风控模型组")
    b = services.team_create(actor=owner, name="风控模型组")
    assert a.slug != b.slug and a.name == b.name == "风控模型组"
    # Their pinyin, heteronyms read as words (重庆 is chong-qing, 银行 yin-hang).
    assert (a.slug, b.slug) == ("feng-kong-mo-xing-zu", "feng-kong-mo-xing-zu-2")
    assert services.team_create(actor=owner, name="重庆银行 AI").slug == "chong-qing-yin-hang-ai"
    assert services.team_create(actor=owner, name="★★").slug == "team"


def test_invite_by_username_with_role(owner, team, make_user):
    make_user("wang")
    membership = services.membership_add(actor=owner, team=team, username="wang", role="annotator")
    assert membership.role == Role.ANNOTATOR
    event = AuditEvent.objects.get(action="membership.add")
    assert event.team == team and event.actor == owner
    assert event.data == {"username": "wang", "role": "annotator"}


@pytest.mark.parametrize(
    ("username", "role", "message"),
    [
        ("nobody", "viewer", "No active account has the username “nobody”"),
        ("olivia", "viewer", "already a member"),
        ("wang", "admin", "Unknown role “admin”"),
    ],
)
def test_invite_errors_say_what_is_wrong(owner, team, make_user, username, role, message):
    make_user("wang")
    with pytest.raises(ValidationError, match=message):
        services.membership_add(actor=owner, team=team, username=username, role=role)
    assert Membership.objects.filter(team=team).count() == 1


def test_the_last_owner_can_neither_leave_nor_be_demoted(owner, team, make_user):
    only_owner = Membership.objects.get(team=team, user=owner)
    with pytest.raises(ValidationError, match="at least one owner"):
        services.membership_change_role(actor=owner, membership=only_owner, role="viewer")
    with pytest.raises(ValidationError, match="at least one owner"):
        services.membership_remove(actor=owner, membership=only_owner)
    make_user("li")
    services.membership_add(actor=owner, team=team, username="li", role="owner")
    services.membership_change_role(actor=owner, membership=only_owner, role="viewer")
    services.membership_remove(actor=owner, membership=only_owner)
    remaining = Membership.objects.filter(team=team).values_list("user__username", "role")
    assert list(remaining) == [("li", "owner")]


def test_console_invite_change_role_and_remove(client, owner, team, make_user):
    make_user("zhao")
    client.force_login(owner)
    response = client.post(
        reverse("console:members", kwargs={"team": team.slug}),
        {"username": "zhao", "role": "maintainer"},
    )
    assert response.status_code == 302
    m = Membership.objects.get(team=team, user__username="zhao")
    assert m.role == Role.MAINTAINER
    client.post(
        reverse("console:member_role", kwargs={"team": team.slug, "membership_id": m.pk}),
        {"role": "viewer"},
    )
    m.refresh_from_db()
    assert m.role == Role.VIEWER
    client.post(reverse("console:member_remove", kwargs={"team": team.slug, "membership_id": m.pk}))
    assert not Membership.objects.filter(pk=m.pk).exists()
    assert actions(team)[-3:] == ["membership.add", "membership.role_change", "membership.remove"]


def test_console_invite_of_unknown_user_shows_the_error(client, owner, team):
    client.force_login(owner)
    response = client.post(
        reverse("console:members", kwargs={"team": team.slug}),
        {"username": "ghost", "role": "viewer"},
        HTTP_ACCEPT_LANGUAGE="en",
    )
    assert response.status_code == 200
    assert "No active account has the username “ghost”" in response.content.decode()


def test_a_user_in_several_teams_sees_and_switches_between_them(client, owner, team, make_team):
    second = make_team("Beta", {owner: Role.VIEWER})
    client.force_login(owner)
    page = client.get(reverse("console:dashboard", kwargs={"team": second.slug})).content.decode()
    assert reverse("console:dashboard", kwargs={"team": team.slug}) in page
    assert "Beta" in page
    # The console remembers the last team for the next visit…
    assert client.get(reverse("console:home"))["Location"] == f"/t/{second.slug}/"
    # …and for the next login, whichever of its pages was the last one.
    client.get(reverse("console:members", kwargs={"team": team.slug}))
    client.logout()
    client.force_login(owner)
    assert client.get(reverse("console:home"))["Location"] == f"/t/{team.slug}/"
    client.get(reverse("console:dashboard", kwargs={"team": second.slug}))
    client.logout()
    client.force_login(owner)
    assert client.get(reverse("console:home"))["Location"] == f"/t/{second.slug}/"


def test_a_user_without_team_is_asked_to_create_one(client, make_user, settings):
    settings.PLATFORM_TEAM_CREATION = "any"
    client.force_login(make_user("new"))
    assert client.get(reverse("console:home"))["Location"] == reverse("console:team_create")
    response = client.post(reverse("console:team_create"), {"name": "Gamma"})
    assert response["Location"] == "/t/gamma/"


def test_site_admin_creates_accounts_others_cannot(client, make_user):
    admin = make_user("root", is_staff=True)
    client.force_login(make_user("plain"))
    refused = client.post(reverse("console:users"), {"username": "x", "password": "p"})
    assert refused.status_code == 404
    client.force_login(admin)
    response = client.post(
        reverse("console:users"), {"username": "newbie", "password": "Long-enough-pw-42"}
    )
    assert response.status_code == 302
    assert AuditEvent.objects.filter(action="user.create", actor=admin).exists()
    weak = client.post(
        reverse("console:users"), {"username": "weak", "password": "123"}, HTTP_ACCEPT_LANGUAGE="en"
    )
    assert "too short" in weak.content.decode()


def test_password_change_reset_and_deactivation(client, make_user):
    admin = make_user("root", is_staff=True)
    user = make_user("wu", password="Old-Pass-2026")
    client.force_login(user)
    response = client.post(
        reverse("console:password_change"),
        {
            "old_password": "Old-Pass-2026",
            "new_password1": "New-Pass-2026!",
            "new_password2": "New-Pass-2026!",
        },
    )
    assert response.status_code == 302
    user.refresh_from_db()
    assert user.check_password("New-Pass-2026!")
    client.force_login(admin)
    client.post(
        reverse("console:user_password", args=[user.pk]),
        {"new_password1": "Reset-Pass-2026", "new_password2": "Reset-Pass-2026"},
    )
    user.refresh_from_db()
    assert user.check_password("Reset-Pass-2026")
    client.post(reverse("console:user_active", args=[user.pk]))
    user.refresh_from_db()
    assert not user.is_active
    # An administrator cannot lock themself out.
    client.post(reverse("console:user_active", args=[admin.pk]))
    admin.refresh_from_db()
    assert admin.is_active
    actions = AuditEvent.objects.exclude(action="login").order_by("id")
    assert list(actions.values_list("action", flat=True)) == [
        "password.change",
        "password.reset",
        "user.deactivate",
    ]


def test_switching_team_keeps_the_kind_of_page(client, owner, team, make_team):
    from labeling.datasets import dataset_create

    second = make_team("Beta", {owner: Role.VIEWER})
    dataset = dataset_create(actor=owner, team=team, name="评论", task_kind="text_classification")
    client.force_login(owner)

    def offered(url: str) -> str:
        """Where the switcher takes the user into the second team from ``url``."""
        page = client.get(url).content.decode()
        return re.search(r'<option value="([^"]+)"[^>]*>Beta</option>', page).group(1)

    datasets = reverse("labeling:datasets", kwargs={"team": second.slug})
    assert offered(reverse("labeling:datasets", kwargs={"team": team.slug})) == datasets
    # An object's page: its section's list in the other team (which has no such object).
    page = reverse("labeling:dataset", kwargs={"team": team.slug, "dataset_id": dataset.pk})
    assert offered(page) == datasets
    usage = reverse("console:usage", kwargs={"team": team.slug})
    assert offered(usage) == reverse("console:usage", kwargs={"team": second.slug})
    # The owners' audit log: the other team's dashboard (a viewer there).
    audit = reverse("console:audit", kwargs={"team": team.slug})
    assert offered(audit) == reverse("console:dashboard", kwargs={"team": second.slug})


def test_a_new_team_is_guided_from_data_to_an_endpoint(client, owner, team):
    from deployment.models import Endpoint
    from labeling.datasets import dataset_create

    client.force_login(owner)
    url = reverse("console:dashboard", kwargs={"team": team.slug})

    def guide() -> list[tuple[str, bool, bool]]:
        """(step, done, the next one) as the dashboard shows them."""
        page = client.get(url).content.decode()
        return [
            (name, done == "1", current != "")
            for name, done, current in re.findall(
                r'<li data-step="(\w+)" data-done="([01])"( aria-current="step")?', page
            )
        ]

    assert guide() == [
        ("upload", False, True),
        ("label", False, False),
        ("train", False, False),
        ("deploy", False, False),
    ]
    dataset_create(actor=owner, team=team, name="评论", task_kind="text_classification")
    # Labeling is optional (data may come labeled): training is next.
    assert guide() == [
        ("upload", True, False),
        ("label", False, False),
        ("train", False, True),
        ("deploy", False, False),
    ]
    Endpoint.objects.create(team=team, name="ping-lun", task_kind="text_classification")
    assert guide() == []  # once something serves, the dashboard is the team's own
