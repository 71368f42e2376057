"""Accounts: password and token guessing, tokens that outlive their maker, what a password
change or a deactivation leaves working, another user's audit trail, who creates teams, and the
initial administrator's password. Each attack goes through real HTTP (Django's test client:
the whole middleware stack, the login view, DRF's authentication)."""

import re
import stat
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console import services
from console.models import ApiToken, AuditEvent, Membership
from console.roles import Role
from console.signals import user_access_revoked

PASSWORD = "pw-Secret-123"  # make_user's
LIMIT = 5


@pytest.fixture(autouse=True)
def real_limits(settings):
    """The platform's defaults, named here so that the tests do not depend on them."""
    settings.LOGIN_FAILURE_LIMIT = LIMIT
    settings.LOGIN_LOCKOUT_MINUTES = 15
    settings.TRUSTED_PROXIES = []


def login(username: str, password: str, address: str, client: Client | None = None):
    client = client or Client()
    response = client.post(
        reverse("console:login"),
        {"username": username, "password": password},
        REMOTE_ADDR=address,
        HTTP_ACCEPT_LANGUAGE="en",
    )
    return response


def bearer(key: str, address: str = "10.0.0.50") -> Client:
    return Client(
        HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_ACCEPT_LANGUAGE="en", REMOTE_ADDR=address
    )


def assert_locked(response) -> None:
    assert response.status_code == 429, response.status_code
    assert 0 < int(response["Retry-After"]) <= 15 * 60
    body = response.content.decode()
    assert "Try again after" in body and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", body)


@pytest.fixture
def staff(make_user):
    return make_user("root", is_staff=True)


def staff_client(user) -> Client:
    client = Client(HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(user)
    return client


# -- Password guessing ------------------------------------------------------------------------


def test_password_guessing_locks_the_account_and_the_address(owner, make_user):
    make_user("wang")
    for n in range(LIMIT - 1):
        assert login("olivia", f"guess-{n}", "10.0.0.1").status_code == 200
    assert_locked(login("olivia", "guess-last", "10.0.0.1"))
    # The account is locked: the right password, from this address or any other, is refused.
    attacker = Client(HTTP_ACCEPT_LANGUAGE="en")
    assert_locked(login("olivia", PASSWORD, "10.0.0.1", attacker))
    assert_locked(login("olivia", PASSWORD, "10.0.0.2", attacker))
    # The address is locked: another account's right password from it is refused too.
    assert_locked(login("wang", PASSWORD, "10.0.0.1", attacker))
    assert attacker.get(reverse("console:tokens")).status_code == 302  # never logged in
    # The lockout is in the audit log, once, with the address and when it ends.
    locked = AuditEvent.objects.get(action="login.locked")
    assert (locked.actor_username, locked.ip_address) == ("olivia", "10.0.0.1")
    assert locked.data["address"] == "10.0.0.1" and locked.data["until"]


def test_the_lockout_ends_after_the_cool_off(owner, settings):
    for n in range(LIMIT):
        login("olivia", f"guess-{n}", "10.0.0.1")
    assert_locked(login("olivia", PASSWORD, "10.0.0.1"))
    from axes.models import AccessAttempt

    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert login("olivia", PASSWORD, "10.0.0.1").status_code == 302


def test_staff_unlock_an_account_and_an_address(owner, staff, make_user):
    make_user("wang")
    for n in range(LIMIT):
        login("olivia", f"guess-{n}", f"10.0.0.{n}")  # the account, from many addresses
        login(f"nobody-{n}", "guess", "10.0.0.99")  # many accounts, from one address
    admin = staff_client(staff)
    page = admin.get(reverse("console:users")).content.decode()
    assert 'data-lockout="olivia"' in page and 'data-lockout="10.0.0.99"' in page
    listed = {(x["kind"], x["value"]) for x in admin.get("/api/v1/lockouts/").json()}
    assert listed == {("account", "olivia"), ("address", "10.0.0.99")}
    # A non-staff account sees no lockouts and lifts none.
    plain = staff_client(make_user("plain"))
    assert plain.get("/api/v1/lockouts/").status_code == 403
    assert plain.delete("/api/v1/lockouts/?username=olivia").status_code == 403
    refused = plain.post(reverse("console:lockout_clear"), {"kind": "account", "value": "olivia"})
    assert refused.status_code == 404
    assert_locked(login("olivia", PASSWORD, "10.0.0.50"))
    assert_locked(login("wang", PASSWORD, "10.0.0.99"))
    # Staff lift the account's lockout on the Accounts page: olivia logs in again.
    admin.post(reverse("console:lockout_clear"), {"kind": "account", "value": "olivia"})
    assert login("olivia", PASSWORD, "10.0.0.50").status_code == 302
    assert_locked(login("wang", PASSWORD, "10.0.0.99"))
    # ... and the address's through the API.
    assert admin.delete("/api/v1/lockouts/?address=10.0.0.99").json() == {"cleared": LIMIT}
    assert admin.get("/api/v1/lockouts/").json() == []
    assert login("wang", PASSWORD, "10.0.0.99").status_code == 302
    unlocks = AuditEvent.objects.filter(action="login.unlock", actor=staff)
    assert unlocks.count() == 2


def test_a_forged_forwarded_for_does_not_escape_the_address_lockout(owner, make_user, settings):
    """X-Forwarded-For is the client's to write: believed only from a trusted proxy."""
    make_user("wang")
    for n in range(LIMIT):
        client = Client(HTTP_X_FORWARDED_FOR=f"192.0.2.{n}")
        login(f"nobody-{n}", "guess", "10.0.0.9", client)
    forged = Client(HTTP_X_FORWARDED_FOR="192.0.2.200", HTTP_ACCEPT_LANGUAGE="en")
    assert_locked(login("wang", PASSWORD, "10.0.0.9", forged))
    # Behind a trusted proxy, the address it appended is the client's: one client's failures
    # lock that client, not the proxy (and so not everyone behind it).
    settings.TRUSTED_PROXIES = ["127.0.0.1"]
    for n in range(LIMIT):
        proxied = Client(HTTP_X_FORWARDED_FOR=f"1.2.3.{n}, 10.0.1.1")
        login(f"ghost-{n}", "guess", "127.0.0.1", proxied)
    assert_locked(login("wang", PASSWORD, "127.0.0.1", Client(HTTP_X_FORWARDED_FOR="10.0.1.1")))
    other = Client(HTTP_X_FORWARDED_FOR="10.0.1.2")
    assert login("wang", PASSWORD, "127.0.0.1", other).status_code == 302


def test_a_flood_of_bad_tokens_from_one_address_is_throttled(owner):
    _token, key = services.api_token_create(actor=owner, name="real")
    flood = [bearer(f"mp_guess{n:040d}", "10.0.0.66").get("/api/v1/me/") for n in range(LIMIT + 5)]
    codes = [r.status_code for r in flood]
    assert codes[: LIMIT - 1] == [401] * (LIMIT - 1) and set(codes[LIMIT - 1 :]) == {429}, codes
    for refused in flood[LIMIT - 1 :]:
        assert int(refused["Retry-After"]) > 0
        assert "Try again after" in refused.json()["detail"]
    # Locked is locked: not even a real token gets a different answer from that address.
    assert bearer("mp_" + "x" * 43, "10.0.0.66").get("/api/v1/me/").status_code == 429
    # Other addresses are not affected, and the holder of the real token still gets through.
    assert bearer("mp_another_guess", "10.0.0.67").get("/api/v1/me/").status_code == 401
    assert bearer(key, "10.0.0.67").get("/api/v1/me/").status_code == 200
    # One audit event for the lockout, not one per guess.
    locked = AuditEvent.objects.filter(action="login.locked")
    assert locked.count() == 1 and locked.get().data["by"] == "token"
    assert locked.get().ip_address == "10.0.0.66"


# -- Tokens -----------------------------------------------------------------------------------


def test_a_one_day_token_cannot_mint_a_longer_or_never_expiring_token(owner):
    parent, key = services.api_token_create(actor=owner, name="day", expires_in_days=1)
    api = bearer(key)
    for days in (None, 30, 3650):
        refused = api.post(
            "/api/v1/tokens/", {"name": "x", "expires_in_days": days}, "application/json"
        )
        assert refused.status_code == 400, (days, refused.content)
        assert "cannot create one that outlives it" in str(refused.json())
    # The default lifetime (90 days) is cut to the parent's.
    child = api.post("/api/v1/tokens/", {"name": "child"}, "application/json")
    assert child.status_code == 201
    assert ApiToken.objects.get(name="child").expires_at <= parent.expires_at
    assert ApiToken.objects.filter(user=owner).count() == 2
    # Through a session (the Tokens page), a user still chooses any lifetime.
    page = Client()
    page.force_login(owner)
    page.post(reverse("console:tokens"), {"name": "forever", "expires_in_days": "never"})
    assert ApiToken.objects.get(name="forever").expires_at is None


def test_a_password_change_revokes_tokens_and_ends_other_sessions(owner):
    _token, key = services.api_token_create(actor=owner, name="ci")
    here, elsewhere = Client(), Client()
    for client, address in ((here, "10.0.0.1"), (elsewhere, "10.0.0.2")):
        assert login("olivia", PASSWORD, address, client).status_code == 302
    assert bearer(key).get("/api/v1/me/").status_code == 200
    changed = here.post(
        reverse("console:password_change"),
        {
            "old_password": PASSWORD,
            "new_password1": "A-new-long-pw-77",
            "new_password2": "A-new-long-pw-77",
        },
    )
    assert changed.status_code == 302
    assert bearer(key).get("/api/v1/me/").status_code == 401
    assert elsewhere.get(reverse("console:tokens")).status_code == 302  # logged out
    assert here.get(reverse("console:tokens")).status_code == 200  # this session stays
    from django.contrib.sessions.models import Session

    assert Session.objects.count() == 1
    assert AuditEvent.objects.get(action="password.change").data["tokens_revoked"] == 1


def test_a_staff_password_reset_revokes_the_accounts_tokens(owner, staff):
    _token, key = services.api_token_create(actor=owner, name="ci")
    victim_session = Client()
    login("olivia", PASSWORD, "10.0.0.1", victim_session)
    reset = staff_client(staff).post(
        reverse("console:user_password", kwargs={"user_id": owner.pk}),
        {"new_password1": "A-new-long-pw-77", "new_password2": "A-new-long-pw-77"},
    )
    assert reset.status_code == 302
    assert bearer(key).get("/api/v1/me/").status_code == 401
    assert victim_session.get(reverse("console:tokens")).status_code == 302


def test_staff_list_and_revoke_another_users_tokens(owner, staff, make_user):
    token, key = services.api_token_create(actor=owner, name="leaked")
    url = f"/api/v1/users/{owner.pk}/tokens/"
    # Not for anybody else: the route does not exist for them.
    plain = staff_client(make_user("plain"))
    assert plain.get(url).status_code == 404
    assert plain.delete(f"{url}{token.pk}/").status_code == 404
    assert (
        plain.get(reverse("console:user_tokens", kwargs={"user_id": owner.pk})).status_code == 404
    )
    admin = staff_client(staff)
    assert [t["name"] for t in admin.get(url).json()["results"]] == ["leaked"]
    page = admin.get(reverse("console:user_tokens", kwargs={"user_id": owner.pk})).content
    assert b'data-token="leaked"' in page and key.encode() not in page
    revoked = admin.delete(f"{url}{token.pk}/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert bearer(key).get("/api/v1/me/").status_code == 401
    event = AuditEvent.objects.get(action="token.revoke")
    assert event.actor == staff and event.data == {"user": "olivia"}
    # ... and on the console page.
    second, second_key = services.api_token_create(actor=owner, name="second")
    admin.post(
        reverse("console:user_token_revoke", kwargs={"user_id": owner.pk, "token_id": second.pk})
    )
    assert bearer(second_key).get("/api/v1/me/").status_code == 401


def test_a_deactivated_users_sessions_and_tokens_stop_working(
    owner, team, staff, django_capture_on_commit_callbacks
):
    revoked = []

    def hook(sender, user, team, **kwargs):
        revoked.append((user.username, team))

    user_access_revoked.connect(hook)
    try:
        _token, key = services.api_token_create(actor=owner, name="ci")
        session = Client()
        login("olivia", PASSWORD, "10.0.0.1", session)
        with django_capture_on_commit_callbacks(execute=True):
            staff_client(staff).post(reverse("console:user_active", kwargs={"user_id": owner.pk}))
        owner.refresh_from_db()
        assert not owner.is_active
        assert session.get(reverse("console:tokens")).status_code == 302
        assert bearer(key).get("/api/v1/me/").status_code == 401
        assert revoked == [("olivia", None)]
        # Activated again, the account's old tokens stay revoked.
        admin = staff_client(staff)
        answer = admin.post(
            f"/api/v1/users/{owner.pk}/active/", {"is_active": True}, "application/json"
        )
        assert answer.json()["is_active"] is True
        assert bearer(key).get("/api/v1/me/").status_code == 401
        # Removal from a team is told too.
        member = get_user_model().objects.create_user("m1", password=PASSWORD)
        membership = Membership.objects.create(team=team, user=member, role=Role.ANNOTATOR)
        with django_capture_on_commit_callbacks(execute=True):
            services.membership_remove(actor=staff, membership=membership)
        assert revoked[-1] == ("m1", team)
    finally:
        user_access_revoked.disconnect(hook)


# -- Another user's audit trail ---------------------------------------------------------------


def _audit_page(user, team_slug: str):
    client = Client(HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(user)
    response = client.get(reverse("console:audit", kwargs={"team": team_slug}))
    return list(response.context["page"]) if response.status_code == 200 else []


def test_an_owner_does_not_see_a_new_members_past(owner, team, make_user):
    """The owner adds an account (no consent asked) to read its logins and addresses: only what
    happened after it joined is shown."""
    victim = make_user("victim")
    login("victim", "typo", "203.0.113.7")
    login("victim", PASSWORD, "203.0.113.8")
    services.api_token_create(actor=victim, name="before")
    boss = Client(HTTP_ACCEPT_LANGUAGE="en")
    boss.force_login(owner)
    added = boss.post(
        reverse("console:members", kwargs={"team": team.slug}),
        {"username": "victim", "role": "viewer"},
    )
    assert added.status_code == 302
    login("victim", PASSWORD, "203.0.113.9")
    page = boss.get(reverse("console:audit", kwargs={"team": team.slug}))
    shown = [(e.action, e.actor_username, e.ip_address) for e in page.context["page"]]
    api = boss.get(f"/api/v1/teams/{team.slug}/audit/", {"actor": "victim"}).json()["results"]
    for events in (
        [e for e in shown if e[1] == "victim"],
        [(e["action"], e["actor"], e["ip_address"]) for e in api],
    ):
        assert events == [("login", "victim", "203.0.113.9")], events
    html = page.content.decode()
    assert "203.0.113.7" not in html and "203.0.113.8" not in html
    # Not even with a date range that covers the past.
    old = boss.get(f"/api/v1/teams/{team.slug}/audit/", {"actor": "victim", "since": "2000-01-01"})
    assert [e["ip_address"] for e in old.json()["results"]] == ["203.0.113.9"]


# -- Who creates teams ------------------------------------------------------------------------


def test_only_staff_create_teams_unless_the_site_allows_anyone(make_user, staff, settings):
    plain = staff_client(make_user("plain"))
    page = plain.get(reverse("console:team_create"))
    assert page.status_code == 200 and b'data-testid="team-create-refused"' in page.content
    assert plain.post(reverse("console:team_create"), {"name": "Mine"}).status_code == 403
    assert plain.post("/api/v1/teams/", {"name": "Mine"}, "application/json").status_code == 403
    assert not Membership.objects.exists()
    assert staff_client(staff).post("/api/v1/teams/", {"name": "Ops"}).status_code == 201
    settings.PLATFORM_TEAM_CREATION = "any"
    assert plain.post(reverse("console:team_create"), {"name": "Mine"}).status_code == 302
    assert plain.post("/api/v1/teams/", {"name": "Yours"}, "application/json").status_code == 201


def test_the_new_team_link_is_shown_only_to_those_who_may(make_user, make_team, settings):
    user = make_user("plain")
    make_team("Alpha", {user: Role.OWNER})
    client = staff_client(user)
    link = reverse("console:team_create").encode()
    assert link not in client.get(reverse("console:dashboard", kwargs={"team": "alpha"})).content
    settings.PLATFORM_TEAM_CREATION = "any"
    assert link in client.get(reverse("console:dashboard", kwargs={"team": "alpha"})).content


# -- The initial administrator's password -----------------------------------------------------


def test_bootstrap_prints_the_generated_password_only_once(
    db, settings, tmp_path, capsys, monkeypatch
):
    settings.DATA_DIR = tmp_path
    monkeypatch.delenv("PLATFORM_ADMIN_PASSWORD", raising=False)
    call_command("platform_bootstrap", url="http://127.0.0.1:8000/")
    first = capsys.readouterr().out
    password_file = tmp_path / "initial_admin_password"
    password = password_file.read_text().strip()
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert f"admin / {password}" in first
    for _ in range(2):  # every later start
        call_command("platform_bootstrap", url="http://127.0.0.1:8000/")
        later = capsys.readouterr().out
        assert password not in later
        assert str(password_file) in later and "manage.py changepassword admin" in later
