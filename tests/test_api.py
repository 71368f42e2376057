import pytest
from django.utils import translation
from rest_framework.test import APIClient

from console.models import Membership
from console.roles import Role


def api_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_openapi_schema_describes_the_api(owner):
    response = api_for(owner).get("/api/v1/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/api/v1/teams/{team}/members/" in paths
    assert "/api/v1/tokens/" in paths


def test_api_docs_page_serves_its_own_assets(client, owner):
    client.force_login(owner)
    page = client.get("/api/v1/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in page
    assert "cdn" not in page.lower() and "https://" not in page


def test_team_and_members_through_the_api(owner, make_user, settings):
    settings.PLATFORM_TEAM_CREATION = "any"
    make_user("sun")
    api = api_for(owner)
    created = api.post("/api/v1/teams/", {"name": "NLP"}, format="json")
    assert created.status_code == 201 and created.json()["slug"] == "nlp"
    assert created.json()["role"] == "owner"
    added = api.post(
        "/api/v1/teams/nlp/members/", {"username": "sun", "role": "viewer"}, format="json"
    )
    assert added.status_code == 201
    member_id = added.json()["id"]
    changed = api.patch(
        f"/api/v1/teams/nlp/members/{member_id}/", {"role": "maintainer"}, format="json"
    )
    assert changed.json()["role"] == "maintainer"
    members = api.get("/api/v1/teams/nlp/members/").json()["results"]
    assert {(m["username"], m["role"]) for m in members} == {
        ("olivia", "owner"),
        ("sun", "maintainer"),
    }
    assert api.delete(f"/api/v1/teams/nlp/members/{member_id}/").status_code == 204


def test_api_validation_errors_are_clear(owner, team):
    api = api_for(owner)
    unknown = api.post(
        f"/api/v1/teams/{team.slug}/members/",
        {"username": "nobody", "role": "viewer"},
        format="json",
        HTTP_ACCEPT_LANGUAGE="en",
    )
    assert unknown.status_code == 400
    assert "nobody" in str(unknown.json())
    bad_role = api.post(
        f"/api/v1/teams/{team.slug}/members/", {"username": "olivia", "role": "king"}, format="json"
    )
    assert bad_role.status_code == 400 and "role" in bad_role.json()


def test_members_can_read_but_only_owners_manage(owner, team, make_user):
    maintainer = make_user("ma")
    Membership.objects.create(team=team, user=maintainer, role=Role.MAINTAINER)
    api = api_for(maintainer)
    assert api.get(f"/api/v1/teams/{team.slug}/members/").status_code == 200
    assert api.get(f"/api/v1/teams/{team.slug}/audit/").status_code == 403
    assert (
        api.post(
            f"/api/v1/teams/{team.slug}/members/",
            {"username": "ma", "role": "owner"},
            format="json",
        ).status_code
        == 403
    )


def test_a_uniqueness_broken_by_a_concurrent_request_is_a_409():
    """Between a service's check and its write another request took the name: the database
    refuses the write, and the client gets a 409 that says to try again, not a 500."""
    from django.db import IntegrityError
    from rest_framework.exceptions import APIException

    from console.api import service_call

    def create(**kwargs):
        raise IntegrityError("UNIQUE constraint failed: labeling_dataset.team_id, name")

    with translation.override("en"), pytest.raises(APIException) as caught:
        service_call(create, name="ds")
    assert caught.value.status_code == 409
    assert "try again" in str(caught.value.detail)

    # Any other integrity error is a bug, not a race: it stays a 500.
    def broken(**kwargs):
        raise IntegrityError("NOT NULL constraint failed: labeling_dataset.name")

    with pytest.raises(IntegrityError):
        service_call(broken, name="ds")


@pytest.mark.django_db(transaction=True)
def test_the_same_name_created_at_once_is_one_201_and_409s(owner, team):
    """Requests that create the same dataset at the same moment, each in its own thread and
    database connection: one wins, the others get a 409 (or the 400 of the service's own check
    when the winner committed first), never a 500, and one dataset exists."""
    import threading

    from django.db import connection
    from rest_framework.test import APIClient

    from console.services import api_token_create
    from labeling.models import Dataset

    if connection.vendor == "sqlite":
        pytest.skip("SQLite serialises writers: the race needs PostgreSQL, as CI has")
    _, key = api_token_create(actor=owner, name="race")
    barrier, codes = threading.Barrier(6), []

    def create() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
        barrier.wait()
        r = client.post(
            f"/api/v1/teams/{team.slug}/datasets/",
            {"name": "同名", "task_kind": "text_classification"},
            format="json",
        )
        codes.append(r.status_code)
        connection.close()

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes).count(201) == 1 and set(codes) <= {201, 400, 409}, codes
    assert Dataset.objects.filter(team=team, name="同名").count() == 1
