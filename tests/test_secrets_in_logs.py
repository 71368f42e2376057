"""Passwords and keys never reach the logs, the audit log or the sessions: an administrator
creates an account, its user logs in (once with a wrong password), changes the password, makes
an API token and an endpoint key and uses them; everything the platform logged on the way, at
every level, and everything it stored beside the hashes, is searched for each secret."""

import logging

import pytest
from django.contrib.sessions.models import Session
from django.urls import reverse
from rest_framework.test import APIClient

from console.models import AuditEvent
from console.roles import Role

pytestmark = pytest.mark.django_db

PASSWORD, WRONG, NEW_PASSWORD = "Initial-pw-9f3k2", "Wrong-pw-77x1q", "Changed-pw-4j8s0"


def test_secrets_are_never_logged_or_stored(client, make_user, make_team, caplog, settings):
    caplog.set_level(logging.DEBUG)
    settings.PLATFORM_TEAM_CREATION = "any"  # wang creates a team through the API
    admin = make_user("admin")
    admin.is_staff = True
    admin.save()
    client.force_login(admin)
    client.post(reverse("console:users"), {"username": "wang", "password": PASSWORD})

    client.logout()
    login = reverse("console:login")
    assert client.post(login, {"username": "wang", "password": WRONG}).status_code == 200
    assert client.post(login, {"username": "wang", "password": PASSWORD}).status_code == 302
    changed = client.post(
        reverse("console:password_change"),
        {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert changed.status_code == 302
    made = client.post(reverse("console:tokens"), {"name": "ci"}, follow=True)
    token = made.context["new_key"]

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api.get("/api/v1/me/").status_code == 200
    created = api.post("/api/v1/teams/", {"name": "密钥"}, format="json")
    assert created.status_code == 201, created.content
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION=f"Bearer {token}x")
    assert wrong.get("/api/v1/me/").status_code == 401

    from console.models import Team
    from deployment.keys import endpoint_key_create
    from deployment.models import Endpoint

    team = Team.objects.get(slug=created.json()["slug"])
    assert team.memberships.get().role == Role.OWNER
    endpoint = Endpoint.objects.create(team=team, name="secrets", task_kind="text_classification")
    wang = team.memberships.get().user
    _, endpoint_key = endpoint_key_create(actor=wang, endpoint=endpoint, name="app")

    secrets = {PASSWORD, WRONG, NEW_PASSWORD, token, endpoint_key}
    logged = caplog.text + "".join(repr(r.args) for r in caplog.records)
    stored = [str(s.get_decoded()) for s in Session.objects.all()]
    stored += [f"{e.data}{e.target_repr}{e.actor_username}" for e in AuditEvent.objects.all()]
    # What was searched holds the events: the logs saw the refused token, the audit log the
    # account, both logins and both keys.
    assert "Unauthorized: /api/v1/me/" in caplog.text
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"user.create", "login", "login.failed", "token.create"} <= actions
    for secret in secrets:
        assert secret not in logged, f"a secret ({secret[:4]}…) was logged"
        assert not any(secret in value for value in stored), f"{secret[:4]}… was stored"
