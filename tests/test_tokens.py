from django.urls import reverse
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
