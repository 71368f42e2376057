"""Login with the enterprise's directory: a real OpenLDAP server (tests/helpers/ldap.py), the
platform configured as a site would (the ``directory`` fixture: search-then-bind, StartTLS,
nested groups, groups mapped to the team ``nlp``)."""

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import translation

from console import services
from console.directory import directory_sync
from console.models import ApiToken, AuditEvent, ExternalAccount, Membership
from console.roles import Role
from tests.helpers.ldap import PASSWORD, PEOPLE, person

User = get_user_model()


def login(client, username: str, password: str = PASSWORD):
    client.logout()
    return client.post(reverse("console:login"), {"username": username, "password": password})


def logged_in(client) -> bool:
    return "_auth_user_id" in client.session


def memberships(username: str) -> dict[str, tuple[str, str]]:
    return {
        m.team.slug: (m.role, m.mapped_from.split(",")[0])
        for m in Membership.objects.filter(user__username=username).select_related("team")
    }


@pytest.fixture
def new_person(directory):
    """A person added to the directory for one test (the server is the session's), removed
    after it; ``groups``: the groups they join."""
    added: list[tuple[str, list[str]]] = []

    def add(uid: str, name: str, *groups: str) -> str:
        directory.add(*person(uid, name))
        for g in groups:
            directory.add_member(g, uid)
        added.append((uid, list(groups)))
        return uid

    yield add
    for uid, groups in added:
        for g in groups:
            try:
                directory.remove_member(g, uid)
            except Exception:  # noqa: S110 - the test took them out already
                pass
        directory.delete(f"uid={uid},{PEOPLE}")


def test_a_directory_login_makes_the_account_with_its_names_and_mapped_team(client, directory):
    response = login(client, "zhangwei")
    assert response.status_code == 302 and logged_in(client)
    assert client.get(reverse("console:members", args=["nlp"])).status_code == 200
    user = User.objects.get(username="zhangwei")
    assert (user.first_name, user.last_name, user.email) == ("伟", "张", "zhangwei@example.com")
    assert not user.has_usable_password()  # the directory's password is never kept
    account = ExternalAccount.objects.get(user=user)
    assert (account.subject, account.display_name) == (f"uid=zhangwei,{PEOPLE}", "张伟")
    assert memberships("zhangwei") == {"nlp": ("maintainer", "cn=nlp-engineers")}
    added = AuditEvent.objects.get(action="membership.add")
    assert (added.actor, added.actor_username) == (None, "directory")
    assert added.data["group"] == "cn=nlp-engineers,ou=groups,dc=example,dc=com"


def test_nested_groups_and_the_strongest_role_and_site_staff(client, directory, new_person):
    login(client, "wangfang")  # contractors ⊂ annotators
    assert memberships("wangfang") == {"nlp": ("annotator", "cn=annotators")}
    new_person("sunli", "孙丽", "nlp-engineers", "nlp-leads")
    login(client, "sunli")
    assert memberships("sunli") == {"nlp": ("owner", "cn=nlp-leads")}
    assert not User.objects.get(username="sunli").is_staff
    login(client, "chenjing")  # platform-admins: site staff, no team
    assert User.objects.get(username="chenjing").is_staff
    assert memberships("chenjing") == {}


def test_names_longer_than_an_account_holds_are_cut_not_refused(client, directory, new_person):
    name = "欧阳" + "长" * 198  # 200 characters: givenName 199, displayName 200
    new_person("ouyang", name, "nlp-engineers")
    assert login(client, "ouyang").status_code == 302 and logged_in(client)
    user = User.objects.get(username="ouyang")
    assert user.first_name == name[1:151] and user.last_name == "欧"
    assert ExternalAccount.objects.get(user=user).display_name == name[:150]


def test_wrong_password_disabled_person_and_unknown_name_are_refused(client, directory):
    for username, password in [
        ("zhangwei", "wrong"),
        ("zhaolei", PASSWORD),  # disabled in the directory: the filter leaves them out
        ("nobody", PASSWORD),
    ]:
        response = login(client, username, password)
        assert response.status_code == 200 and not logged_in(client), username
    assert not User.objects.filter(username__in=["zhaolei", "nobody"]).exists()


@pytest.mark.parametrize("mode", ["ldaps", "direct-bind"])
def test_ldaps_and_a_direct_bind(client, directory, settings, mode):
    if mode == "ldaps":
        settings.LDAP_SERVER_URI, settings.LDAP_START_TLS = directory.tls_url, False
    else:  # no reader account: the person's own bind reads their entry and groups
        settings.LDAP_USER_DN_TEMPLATE = f"uid=%(user)s,{PEOPLE}"
        settings.LDAP_BIND_DN = settings.LDAP_BIND_PASSWORD = ""
    login(client, "lina")
    assert logged_in(client)
    assert memberships("lina") == {"nlp": ("owner", "cn=nlp-leads")}


def test_local_accounts_still_log_in_beside_the_directory(client, directory, make_user):
    make_user("breakglass", password="pw-Secret-123", is_staff=True)
    login(client, "breakglass", "pw-Secret-123")
    assert logged_in(client)


def test_mapped_memberships_cannot_be_changed_in_the_console(client, directory, make_user):
    login(client, "zhangwei")
    membership = Membership.objects.get(user__username="zhangwei")
    admin = make_user("site-admin", is_staff=True)
    with translation.override("en"), pytest.raises(ValidationError, match="directory group"):
        services.membership_change_role(actor=admin, membership=membership, role=Role.VIEWER)
    with pytest.raises(ValidationError):
        services.membership_remove(actor=admin, membership=membership)
    lina = User.objects.create_user("olivia", password="pw-Secret-123")
    Membership.objects.create(team=membership.team, user=lina, role=Role.OWNER)
    client.logout()
    login(client, "olivia", "pw-Secret-123")
    page = client.get(reverse("console:members", args=["nlp"])).content.decode()
    row = page[page.index('data-member="zhangwei"') :].split("</tr>")[0]
    assert "cn=nlp-engineers" in row and "<select" not in row and "Remove" not in row


def test_the_sync_follows_group_changes_and_disables_who_left(client, directory, new_person):
    new_person("liuyang", "刘洋", "nlp-engineers")
    login(client, "liuyang")
    user = User.objects.get(username="liuyang")
    services.api_token_create(actor=user, name="ci")
    assert memberships("liuyang") == {"nlp": ("maintainer", "cn=nlp-engineers")}

    directory.add_member("nlp-leads", "liuyang")  # promoted
    assert directory_sync().deactivated == []
    assert memberships("liuyang") == {"nlp": ("owner", "cn=nlp-leads")}

    directory.remove_member("nlp-leads", "liuyang")
    directory.remove_member("nlp-engineers", "liuyang")  # moved out of NLP
    directory_sync()
    assert memberships("liuyang") == {}
    assert User.objects.get(pk=user.pk).is_active

    directory.replace(f"uid=liuyang,{PEOPLE}", "employeeType", ["disabled"])  # left
    result = directory_sync()
    assert result.deactivated == ["liuyang"] and result.errors == []
    user.refresh_from_db()
    assert not user.is_active
    assert not ApiToken.objects.filter(user=user, revoked_at__isnull=True).exists()
    assert not logged_in(client)  # the session is gone
    event = AuditEvent.objects.filter(action="user.deactivate").get()
    assert event.actor_username == "directory" and event.data["tokens_revoked"] == 1

    directory.replace(f"uid=liuyang,{PEOPLE}", "employeeType", ["staff"])  # back again
    directory_sync()
    assert User.objects.get(pk=user.pk).is_active


def test_a_directory_that_cannot_be_reached_changes_nothing(client, directory, settings):
    login(client, "zhangwei")
    settings.LDAP_SERVER_URI = "ldap://127.0.0.1:9"  # nothing listens
    result = directory_sync()
    assert result.deactivated == [] and result.errors
    assert User.objects.get(username="zhangwei").is_active
    assert memberships("zhangwei") == {"nlp": ("maintainer", "cn=nlp-engineers")}


def test_staff_deactivation_is_not_undone_by_the_directory(client, directory, make_user):
    login(client, "zhangwei")
    user = User.objects.get(username="zhangwei")
    services.user_set_active(actor=make_user("site-admin", is_staff=True), user=user, active=False)
    directory_sync()
    assert not User.objects.get(pk=user.pk).is_active
    client.logout()
    login(client, "zhangwei")
    assert not logged_in(client)


def test_the_pages_say_where_accounts_come_from(client, directory, make_user):
    page = client.get(reverse("console:login")).content.decode()
    assert "LDAP" in page
    login(client, "zhangwei")
    client.logout()
    admin = make_user("site-admin", is_staff=True)
    client.force_login(admin)
    response = client.get(reverse("console:users"))
    assert response.status_code == 200
    page = response.content.decode()
    row = page[page.index('data-user="zhangwei"') :].split("</tr>")[0]
    assert "张伟" in row and "new_password1" not in row
    local = page[page.index('data-user="site-admin"') :].split("</tr>")[0]
    assert "new_password1" in local
    user = User.objects.get(username="zhangwei")
    with pytest.raises(ValidationError):  # a second way in that the directory cannot end
        services.user_set_password(actor=admin, user=user, password="Another-pass-123")


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("LDAP_TEAM_MAP", "{not json", "LDAP_TEAM_MAP is not JSON"),
        ("LDAP_TEAM_MAP", '{"cn=x": "nlp:boss"}', "expected “<team slug>:<role>”"),
        ("LDAP_GROUP_TYPE", "groupOfFriends", "LDAP_GROUP_TYPE 'groupOfFriends' is none of"),
        ("OIDC_TEAM_MAP", '["nlp"]', "OIDC_TEAM_MAP must be an object"),
    ],
)
def test_a_malformed_identity_setting_stops_the_start_naming_it(settings, setting, value, message):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.LDAP_SERVER_URI = "ldap://127.0.0.1:9"
    settings.LDAP_GROUP_SEARCH_BASE = "ou=groups,dc=example,dc=com"
    settings.OIDC_ISSUER = "http://127.0.0.1:9"
    setattr(settings, setting, value)
    with pytest.raises(SystemCheckError, match=message):
        call_command("check")
