"""The deployment API and console pages, on a real serving host."""

import pytest
from django.urls import reverse

from console.services import api_token_create
from deployment.models import Endpoint, Revision
from tests.helpers.serving import converge


@pytest.fixture(autouse=True)
def english(settings):
    settings.LANGUAGE_CODE = "en"


@pytest.fixture
def api(client, owner):
    _token, key = api_token_create(actor=owner, name="ci")
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "en"
    return client


def test_deploy_and_roll_out_through_the_api(db, api, fresh_host, team, model_version):
    v1, v2 = model_version(seed=0), model_version(seed=1)
    base = f"/api/v1/teams/{team.slug}/endpoints/"
    r = api.post(
        base, {"model_version": v1.pk, "name": "shop-reviews", "max_inputs": 2}, "application/json"
    )
    assert r.status_code == 201, r.content
    detail = r.json()
    assert detail["url"].endswith("/v1/endpoints/shop-reviews:predict")
    assert [(x["number"], x["weight"]) for x in detail["revisions"]] == [(1, 100)]
    endpoint = Endpoint.objects.get(name="shop-reviews")

    r = api.post(
        base + f"{endpoint.pk}/keys/", {"name": "app", "rate_per_s": 50}, "application/json"
    )
    assert r.status_code == 201
    key = r.json()["key"]
    assert key.startswith("mpe_") and r.json()["prefix"] == key[:10]
    assert "key" not in api.get(base + f"{endpoint.pk}/keys/").json()["results"][0]

    converge(fresh_host, endpoint)
    assert api.get(base + f"{endpoint.pk}/").json()["state"] == "ready"
    r = fresh_host.predict("shop-reviews", {"inputs": ["很好"]}, key)
    assert r.status_code == 200
    # The console's try-it goes through the platform and is counted like any call.
    r = api.post(base + f"{endpoint.pk}/predict/", {"inputs": ["很好", "很差"]}, "application/json")
    assert r.status_code == 200 and len(r.json()["outputs"]) == 2
    r = api.post(base + f"{endpoint.pk}/predict/", {"inputs": ["好"] * 3}, "application/json")
    assert r.status_code == 413 and "at most 2" in r.json()["error"]["message"]
    r = api.post(base + f"{endpoint.pk}/predict/", {"inputs": [""]}, "application/json")
    assert r.status_code == 422 and "inputs[0] is empty" in r.json()["error"]["message"]
    metrics = api.get(base + f"{endpoint.pk}/metrics/?minutes=5").json()
    assert metrics["total"]["requests"] >= 3 and metrics["total"]["client_errors"] >= 1

    r = api.post(
        base + f"{endpoint.pk}/revisions/",
        {"model_version": v2.pk, "weight": 20},
        "application/json",
    )
    assert r.status_code == 201, r.content
    canary = r.json()["id"]
    r = api.patch(base + f"{endpoint.pk}/revisions/{canary}/", {"weight": 40}, "application/json")
    assert r.json()["weight"] == 40
    assert Revision.objects.get(endpoint=endpoint, number=1).weight == 60
    r = api.post(base + f"{endpoint.pk}/revisions/{canary}/promote/")
    assert [(x["number"], x["status"], x["weight"]) for x in r.json()["revisions"]] == [
        (2, "active", 100),
        (1, "retired", 0),
    ]
    r = api.post(base + f"{endpoint.pk}/rollback/")
    assert r.json()["stable_revision"] == Revision.objects.get(endpoint=endpoint, number=1).pk
    r = api.post(base + f"{endpoint.pk}/rollback/")
    assert r.status_code == 400 and "nothing to roll back" in str(r.json())
    r = api.delete(f"/api/v1/teams/{team.slug}/models/{v1.pk}/")
    assert r.status_code == 400 and "serves traffic" in str(r.json())


def test_console_pages(db, client, owner, team, model_version, fresh_host):
    client.force_login(owner)
    version = model_version()
    page = client.get(reverse("training:model", args=[team.slug, version.pk]))
    assert f"/t/{team.slug}/endpoints/new/?version={version.pk}" in page.content.decode()
    r = client.post(
        reverse("deployment:endpoint_new", args=[team.slug]),
        {
            "model_version": version.pk,
            "name": "",
            "device_type": "cpu",
            "replicas": 1,
            "max_batch_size": 16,
            "max_wait_ms": 3,
            "max_inputs": 64,
        },
    )
    endpoint = Endpoint.objects.get()
    assert r.status_code == 302 and r["Location"].endswith(f"/endpoints/{endpoint.pk}/")
    r = client.post(
        reverse("deployment:key_create", args=[team.slug, endpoint.pk]), {"name": "app"}
    )
    assert r.status_code == 200 and 'data-testid="new-key">mpe_' in r.content.decode()
    # Shown once (in the answer to the form, kept nowhere): the next visit has only its prefix.
    page = reverse("deployment:endpoint", args=[team.slug, endpoint.pk])
    assert 'data-testid="new-key"' not in client.get(page).content.decode()
    listing = client.get(reverse("deployment:endpoints", args=[team.slug])).content.decode()
    assert "reviews" in listing and "100%" in listing
    r = client.post(
        reverse("deployment:endpoint_rollback", args=[team.slug, endpoint.pk]), follow=True
    )
    assert "nothing to roll back" in r.content.decode()


def test_endpoint_keys_expire_through_the_api_the_page_and_the_host(
    db, api, client, owner, fresh_host, team, model_version
):
    from datetime import timedelta

    from django.utils import timezone

    from deployment.models import EndpointKey
    from deployment.rollout import endpoint_deploy

    endpoint = endpoint_deploy(actor=owner, team=team, model_version=model_version())
    keys = f"/api/v1/teams/{team.slug}/endpoints/{endpoint.pk}/keys/"
    made = api.post(keys, {"name": "month", "expires_in_days": 30}, "application/json")
    assert made.status_code == 201, made.content
    month = EndpointKey.objects.get(pk=made.json()["id"])
    assert made.json()["expires_at"] and month.expires_at > timezone.now() + timedelta(days=29)
    forever = api.post(keys, {"name": "forever"}, "application/json").json()
    assert forever["expires_at"] is None  # endpoint keys never expire unless asked to
    bad = api.post(keys, {"name": "x", "expires_in_days": 99999}, "application/json")
    assert bad.status_code == 400 and "expires_in_days" in bad.json()

    # The reconciler hands the host each key's expiry, for the host to check on its own.
    converge(fresh_host, endpoint)
    routed = fresh_host.state()["endpoints"][endpoint.name]["key_expiry"]
    assert routed == {str(month.pk): month.expires_at.timestamp(), str(forever["id"]): None}
    for plain in (made.json()["key"], forever["key"]):
        assert fresh_host.predict(endpoint.name, {"inputs": ["好"]}, plain).status_code == 200

    # Expired (as time passing would): the page says so and the host refuses it.
    EndpointKey.objects.filter(pk=month.pk).update(expires_at=timezone.now() - timedelta(hours=1))
    converge(fresh_host, endpoint)
    assert (
        fresh_host.predict(endpoint.name, {"inputs": ["好"]}, made.json()["key"]).status_code == 401
    )
    assert fresh_host.predict(endpoint.name, {"inputs": ["好"]}, forever["key"]).status_code == 200
    client.defaults.pop("HTTP_AUTHORIZATION")
    client.force_login(owner)
    page = client.get(reverse("deployment:endpoint", args=[team.slug, endpoint.pk])).content
    row = page.decode().split("<td>month</td>")[1].split("</tr>")[0]
    assert "expired" in row and "Revoke" not in row
    # The console's key form takes an expiry too.
    create = reverse("deployment:key_create", args=[team.slug, endpoint.pk])
    client.post(create, {"name": "week", "expires_in_days": "7"})
    week = EndpointKey.objects.get(endpoint=endpoint, name="week")
    assert timedelta(days=6) < week.expires_at - timezone.now() <= timedelta(days=7)
