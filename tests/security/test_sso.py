"""Single sign-on as an attacker tries it, against the real OpenID provider of the ``sso``
fixture: someone who owns an identity at the provider, or holds another's redirect."""

from urllib.parse import parse_qs, urlsplit

import requests
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from console.models import ExternalAccount
from tests.test_sso import logged_in, sso_login

User = get_user_model()


def test_a_provider_identity_never_logs_in_as_an_account_of_its_name(client, sso, make_user):
    local = make_user("olivia", password="Local-pass-123", is_staff=True)
    sso.set("sub-olivia", preferred_username="olivia", email="olivia@example.com", groups=[])
    sso_login(client, sso, "sub-olivia")
    assert not logged_in(client)
    assert not ExternalAccount.objects.filter(user=local).exists()
    # Nor is a second identity with a taken name merged into the first one's account.
    sso_login(client, sso, "sub-zhangwei")
    client.logout()
    sso.set("sub-impostor", preferred_username="zhangwei", groups=["nlp-leads"])
    sso_login(client, sso, "sub-impostor")
    assert not logged_in(client)
    assert User.objects.filter(username__iexact="zhangwei").count() == 1


def test_a_callback_from_another_browser_or_a_forged_one_logs_nobody_in(client, sso):
    start = client.get(reverse("console:oidc_login"))
    query = parse_qs(urlsplit(start["Location"]).query)
    assert query["code_challenge_method"] == ["S256"] and query["code_challenge"][0]
    assert query["nonce"][0] and query["state"][0]
    back = sso.sign_in(start["Location"], "sub-zhangwei", requests.Session())
    victim = Client()  # the victim's browser follows the attacker's redirect: no state of its own
    victim.get(back.removeprefix("http://testserver"))
    assert not logged_in(victim)
    forged = Client()
    forged.get(reverse("console:oidc_callback") + "?code=made-up&state=made-up")
    assert not logged_in(forged)
    # The redirect still works, once, in the browser that asked for it.
    client.get(back.removeprefix("http://testserver"))
    assert logged_in(client)
    replay = Client()
    replay.cookies = client.cookies
    client.logout()
    replay.get(back.removeprefix("http://testserver"))
    assert not logged_in(replay)


def test_a_deactivated_account_cannot_sign_on(client, sso, make_user):
    from console import services

    sso_login(client, sso, "sub-zhangwei")
    user = User.objects.get(username="zhangwei")
    services.user_set_active(actor=make_user("admin", is_staff=True), user=user, active=False)
    sso_login(client, sso, "sub-zhangwei")
    assert not logged_in(client)
