"""Single sign-on with OpenID Connect: a real OpenID provider (tests/helpers/oidc.py), the
platform configured as a site would (the ``sso`` fixture)."""

import pytest
import requests
from django.contrib.auth import get_user_model
from django.urls import reverse

from console.models import AuditEvent, ExternalAccount, Membership

User = get_user_model()


def sso_login(client, provider, subject: str):
    """The whole round: the login page's button, the provider's login, back to the platform;
    the platform's last answer."""
    start = client.get(reverse("console:oidc_login"))
    assert start.status_code == 302 and start["Location"].startswith(provider.issuer)
    back = provider.sign_in(start["Location"], subject, requests.Session())
    assert back.startswith("http://testserver/oidc/callback/"), back
    return client.get(back.removeprefix("http://testserver"))


def logged_in(client) -> bool:
    return "_auth_user_id" in client.session


def memberships(username: str) -> dict[str, tuple[str, str]]:
    return {
        m.team.slug: (m.role, m.mapped_from)
        for m in Membership.objects.filter(user__username=username).select_related("team")
    }


def test_a_single_sign_on_makes_the_account_with_its_claims_and_mapped_team(client, sso):
    page = client.get(reverse("console:login")).content.decode()
    assert "统一身份认证" in page and reverse("console:oidc_login") in page
    response = sso_login(client, sso, "sub-zhangwei")
    assert response.status_code == 302 and logged_in(client)
    assert client.get(reverse("console:members", args=["nlp"])).status_code == 200
    user = User.objects.get(username="zhangwei")
    assert (user.first_name, user.last_name, user.email) == ("伟", "张", "zhangwei@example.com")
    assert not user.has_usable_password()
    account = ExternalAccount.objects.get(user=user)
    assert (account.source, account.subject) == ("oidc", f"{sso.issuer}|sub-zhangwei")
    assert account.display_name == "张伟"
    assert memberships("zhangwei") == {"nlp": ("maintainer", "nlp-engineers")}
    added = AuditEvent.objects.get(action="membership.add")
    assert added.actor_username == "single sign-on"


def test_the_strongest_role_site_staff_and_group_changes_at_the_next_login(client, sso):
    sso_login(client, sso, "sub-lina")
    assert memberships("lina") == {"nlp": ("owner", "nlp-leads")}
    sso_login(client, sso, "sub-chenjing")
    assert User.objects.get(username="chenjing").is_staff
    sso.set("sub-zhangwei", groups=["nlp-engineers"])
    sso_login(client, sso, "sub-zhangwei")
    sso.set("sub-zhangwei", groups=[])  # moved out of NLP at the provider
    client.logout()
    sso_login(client, sso, "sub-zhangwei")
    assert logged_in(client) and memberships("zhangwei") == {}
    assert AuditEvent.objects.filter(action="membership.remove", actor_username="single sign-on")


def test_logout_ends_the_session_at_the_provider_too(client, sso):
    sso_login(client, sso, "sub-zhangwei")
    response = client.post(reverse("console:logout"))
    assert not logged_in(client)
    assert response.status_code == 302
    assert response["Location"].startswith(f"{sso.issuer}/session/end?id_token_hint=")
    assert "post_logout_redirect_uri=http%3A%2F%2Ftestserver%2Flogin%2F" in response["Location"]


def test_a_provider_that_cannot_be_reached_leaves_the_other_logins(client, sso, settings):
    settings.OIDC_ISSUER = "http://127.0.0.1:9"  # nothing listens
    response = client.get(reverse("console:oidc_login"), follow=True)
    assert response.redirect_chain[-1][0] == reverse("console:login")
    assert not logged_in(client)


@pytest.mark.parametrize("path", ["/oidc/authenticate/", "/oidc/callback/?code=x&state=y"])
def test_without_single_sign_on_its_pages_do_not_exist(client, db, path):
    assert client.get(path).status_code == 404
