"""Directory login as an attacker tries it: an insider who owns an entry in the directory (or
can name one), against the real OpenLDAP server of the ``directory`` fixture."""

from django.contrib.auth import authenticate, get_user_model
from django.test import RequestFactory
from django.urls import reverse

from console.models import ExternalAccount, Membership
from tests.helpers.ldap import PASSWORD

User = get_user_model()


def login(client, username: str, password: str = PASSWORD) -> bool:
    client.logout()
    client.post(reverse("console:login"), {"username": username, "password": password})
    return "_auth_user_id" in client.session


def test_a_directory_entry_never_logs_in_as_a_local_account_of_its_name(
    client, directory, make_user
):
    # Site staff's local account is named as a person of the directory, who knows their own
    # directory password: it gets them nothing of the local account.
    local = make_user("chenjing", password="Local-pass-123", is_staff=True)
    assert not login(client, "chenjing", PASSWORD)
    local.refresh_from_db()
    assert local.has_usable_password() and local.check_password("Local-pass-123")
    assert not ExternalAccount.objects.filter(user=local).exists()
    assert login(client, "chenjing", "Local-pass-123")  # the local account still works


def test_filter_injection_and_empty_passwords_log_nobody_in(client, directory):
    for username in ["*", "zhang*", "zhangwei)(uid=*", "*)(|(uid=*", "zhangwei\x00"]:
        assert not login(client, username), username
    # An empty password is an anonymous bind, which LDAP servers accept: refused before it.
    request = RequestFactory().post("/login/")
    assert authenticate(request, username="zhangwei", password="") is None
    assert not User.objects.exclude(username="").exists()


def test_an_untrusted_certificate_refuses_the_login(client, directory, settings):
    # No CA file: the server's self-signed certificate is not trusted, and the login does not
    # fall back to plain text.
    settings.LDAP_CA_FILE = ""
    assert not login(client, "zhangwei")
    settings.LDAP_SERVER_URI, settings.LDAP_START_TLS = directory.tls_url, False
    assert not login(client, "zhangwei")
    settings.LDAP_CA_FILE = str(directory.ca_file)
    assert login(client, "zhangwei")


def test_a_mapped_membership_cannot_be_changed_through_the_api(client, directory, make_user):
    from rest_framework.test import APIClient

    assert login(client, "zhangwei")
    membership = Membership.objects.get(user__username="zhangwei")
    owner = make_user("olivia")
    Membership.objects.create(team=membership.team, user=owner, role="owner")
    api = APIClient()
    api.force_authenticate(owner)
    url = f"/api/v1/teams/nlp/members/{membership.pk}/"
    assert api.patch(url, {"role": "viewer"}, format="json").status_code == 400
    assert api.delete(url).status_code == 400
    membership.refresh_from_db()
    assert membership.role == "maintainer"
    assert api.get(url).json()["mapped_from"].startswith("cn=nlp-engineers,")
