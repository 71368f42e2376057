from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone, translation
from rest_framework.test import APIClient

from console import services
from console.models import ApiToken, AuditEvent, hash_token


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_ACCEPT_LANGUAGE="en")
    return client


def test_token_is_stored_hashed_and_shown_once(client, owner):
    client.force_login(owner)
    response = client.post(reverse("console:tokens"), {"name": "ci"}, follow=True)
    key = response.context["new_key"]
    assert key.startswith("mp_") and key in response.content.decode()
    token = ApiToken.objects.get(user=owner)
    assert token.key_hash == hash_token(key) and key not in token.key_hash
    assert not ApiToken.objects.filter(key_hash=key).exists()
    # Shown once: the next view of the page lists its prefix only.
    page = client.get(reverse("console:tokens")).content.decode()
    assert key not in page and token.prefix in page
    assert "no-store" in response["Cache-Control"]
    # Nowhere in the database now: not in the session, the tokens or the audit log.
    from django.contrib.sessions.models import Session

    stored = [str(s.get_decoded()) for s in Session.objects.all()]
    stored += [str(e.data) + e.target_repr for e in AuditEvent.objects.all()]
    stored += [t.key_hash + t.prefix + t.name for t in ApiToken.objects.all()]
    assert stored and not any(key in value for value in stored)


def test_token_authenticates_the_api_until_revoked(owner, team):
    token, key = services.api_token_create(actor=owner, name="script")
    api = bearer(key)
    me = api.get("/api/v1/me/")
    assert me.status_code == 200 and me.json()["username"] == owner.username
    teams = api.get("/api/v1/teams/").json()["results"]
    assert [(t["slug"], t["role"]) for t in teams] == [(team.slug, "owner")]
    token.refresh_from_db()
    assert token.last_used_at is not None

    services.api_token_revoke(actor=owner, token=token)
    denied = api.get("/api/v1/me/")
    assert denied.status_code == 401
    assert "revoked" in denied.json()["detail"]
    assert list(AuditEvent.objects.values_list("action", flat=True).order_by("id")) == [
        "token.create",
        "token.revoke",
    ]


def test_bad_tokens_are_refused_with_a_reason(db):
    assert bearer("mp_not-a-real-key").get("/api/v1/me/").status_code == 401
    malformed = bearer("abc").get("/api/v1/me/")
    assert malformed.status_code == 401 and "Malformed" in malformed.json()["detail"]


def test_tokens_via_api_create_list_revoke(owner):
    _, key = services.api_token_create(actor=owner, name="bootstrap")
    api = bearer(key)
    created = api.post("/api/v1/tokens/", {"name": "deploy"}, format="json")
    assert created.status_code == 201
    new_key = created.json()["key"]
    listed = api.get("/api/v1/tokens/").json()["results"]
    assert {t["name"] for t in listed} == {"bootstrap", "deploy"}
    assert all("key" not in t for t in listed)
    revoked = api.delete(f"/api/v1/tokens/{created.json()['id']}/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert bearer(new_key).get("/api/v1/me/").status_code == 401


def test_another_users_token_cannot_be_revoked(client, owner, make_user):
    token, _ = services.api_token_create(actor=owner, name="mine")
    client.force_login(make_user("mallory"))
    assert client.post(reverse("console:token_revoke", args=[token.pk])).status_code == 404
    token.refresh_from_db()
    assert token.is_active


def expire(token: ApiToken) -> None:
    """Move the token's expiry into the past, as time passing would."""
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    token.refresh_from_db()


def test_tokens_expire_after_the_default_or_chosen_days_or_never(owner, settings):
    before = timezone.now()
    default, _ = services.api_token_create(actor=owner, name="default")
    assert default.expires_at - before == pytest.approx(
        timedelta(days=90), abs=timedelta(minutes=1)
    )
    week, _ = services.api_token_create(actor=owner, name="week", expires_in_days=7)
    assert week.expires_at - before == pytest.approx(timedelta(days=7), abs=timedelta(minutes=1))
    never, _ = services.api_token_create(actor=owner, name="never", expires_in_days=None)
    assert never.expires_at is None and never.is_active and never.status == "active"

    settings.API_TOKEN_DEFAULT_DAYS = 0  # "never" as the site's default
    assert services.api_token_create(actor=owner, name="site")[0].expires_at is None
    for bad in (0, -3, 3651, True, "7"):
        with translation.override("en"), pytest.raises(ValidationError, match="1 to 3650 days"):
            services.api_token_create(actor=owner, name="bad", expires_in_days=bad)
    data = AuditEvent.objects.filter(action="token.create").order_by("id").first().data
    assert data["expires_at"] == default.expires_at.isoformat()


def test_an_expired_token_is_refused_saying_when_it_expired(owner):
    token, key = services.api_token_create(actor=owner, name="old", expires_in_days=30)
    assert bearer(key).get("/api/v1/me/").status_code == 200
    expire(token)
    assert not token.is_active and token.status == "expired"
    used = token.last_used_at
    denied = bearer(key).get("/api/v1/me/")
    assert denied.status_code == 401
    when = timezone.localtime(token.expires_at).isoformat(timespec="minutes")
    assert denied.json() == {
        "detail": f"This token expired on {when}: create a new one on the Tokens page."
    }
    assert denied["WWW-Authenticate"] == "Bearer"
    token.refresh_from_db()
    assert token.last_used_at == used  # a refused token is not "used"
    # Revoked wins over expired: the message says what the user did.
    services.api_token_revoke(actor=owner, token=token)
    assert "revoked" in bearer(key).get("/api/v1/me/").json()["detail"]


def test_the_tokens_page_offers_an_expiry_and_shows_it(client, owner):
    client.force_login(owner)
    page = client.get(reverse("console:tokens"), HTTP_ACCEPT_LANGUAGE="en")
    form = page.context["form"]
    choices = dict(form.fields["expires_in_days"].choices)
    assert set(choices) == {"7", "30", "90", "365", "never"}
    assert form.fields["expires_in_days"].initial == "90"

    client.post(reverse("console:tokens"), {"name": "weekly", "expires_in_days": "7"})
    client.post(reverse("console:tokens"), {"name": "forever", "expires_in_days": "never"})
    client.post(reverse("console:tokens"), {"name": "plain"})  # left out: the default
    tokens = {t.name: t for t in ApiToken.objects.filter(user=owner)}
    assert tokens["forever"].expires_at is None
    assert tokens["weekly"].expires_at - timezone.now() > timedelta(days=6, hours=23)
    assert tokens["plain"].expires_at - timezone.now() > timedelta(days=89, hours=23)
    refused = client.post(reverse("console:tokens"), {"name": "odd", "expires_in_days": "5"})
    assert refused.status_code == 200 and "expires_in_days" in refused.context["form"].errors
    assert not ApiToken.objects.filter(name="odd").exists()

    expire(tokens["weekly"])
    html = client.get(reverse("console:tokens"), HTTP_ACCEPT_LANGUAGE="en").content.decode()
    rows = {
        name: html.split(f'data-token="{name}"')[1].split("</tr>")[0]
        for name in ("weekly", "forever", "plain")
    }
    assert "expired" in rows["weekly"] and "Revoke" not in rows["weekly"]
    assert "never" in rows["forever"] and "active" in rows["forever"]
    expiry = timezone.localtime(tokens["plain"].expires_at).strftime("%Y-%m-%d %H:%M")
    assert expiry in rows["plain"]


def test_the_api_creates_tokens_with_an_expiry(owner):
    # A token that never expires: a token cannot make one that outlives it (tests/security).
    _, key = services.api_token_create(actor=owner, name="bootstrap", expires_in_days=None)
    api = bearer(key)
    week = api.post("/api/v1/tokens/", {"name": "w", "expires_in_days": 7}, format="json")
    assert week.status_code == 201 and week.json()["expires_at"]
    assert "expires_in_days" not in week.json()
    never = api.post("/api/v1/tokens/", {"name": "n", "expires_in_days": None}, format="json")
    assert never.status_code == 201 and never.json()["expires_at"] is None
    default = api.post("/api/v1/tokens/", {"name": "d"}, format="json").json()
    expires = datetime.fromisoformat(default["expires_at"])
    assert expires - timezone.now() > timedelta(days=89, hours=23)
    bad = api.post("/api/v1/tokens/", {"name": "b", "expires_in_days": 0}, format="json")
    assert bad.status_code == 400 and "expires_in_days" in bad.json()
    listed = {t["name"]: t for t in api.get("/api/v1/tokens/").json()["results"]}
    assert listed["n"]["expires_at"] is None and listed["w"]["expires_at"]
