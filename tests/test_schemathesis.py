"""Schemathesis against the platform's OpenAPI schema: every operation, called through the WSGI
app with an owner's API token on a team that has one object of every kind, with generated
valid and invalid input. No answer may be a 5xx, and every answer must be one the schema
declares, with the declared content type and body.

The schema is the one the API serves (``/api/v1/schema/``, compared below); it is generated
in-process so that pytest gets one test per operation, each on a fresh database."""

from collections.abc import Iterator

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from rest_framework.test import APIClient
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from console import services
from console.roles import Role
from console.wsgi import application
from tests.helpers.routes import object_factories

# Operations whose documented answer may be a 5xx here, each with the reason; the answer must
# still be one the schema documents, in its documented shape.
MAY_ANSWER_503 = {
    # The console's proxy to the serving host: no serving host runs in this test, and the
    # endpoint is not placed anywhere, so it answers 503 "unreachable" (documented).
    "POST /api/v1/teams/{team}/endpoints/{endpoint_id}/predict/",
}
CONFORMANCE = [status_code_conformance, content_type_conformance, response_schema_conformance]

RAW_SCHEMA = SchemaGenerator().get_schema(request=None, public=True)
# Bounded for CI: the fuzzing phase to `max_examples` (below), and the coverage phase's
# boundary cases without its tries of every undeclared HTTP method (the routes tests send those).
CONFIG = SchemathesisConfig.from_dict({"phases": {"coverage": {"unexpected-methods": []}}})
schema = schemathesis.openapi.from_dict(RAW_SCHEMA, config=CONFIG)
schema.app = application


@pytest.fixture
def owner_world(make_user, make_team) -> Iterator[dict]:
    """An owner's token and, in the owner's team, one object for each path parameter."""
    owner = make_user("schema-owner")
    team = make_team("Schemas", {owner: Role.OWNER})
    objects = {name: make() for name, make in object_factories(team, owner).items()}
    _token, key = services.api_token_create(actor=owner, name="schemathesis")
    # Called straight through WSGI, the app opens and ends each request by closing the
    # database connection, which holds the test's transaction; Django's test client
    # disconnects these handlers too.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    try:
        yield {"key": key, "objects": objects}
    finally:
        for signal in (request_started, request_finished):
            signal.connect(close_old_connections)


def test_the_tested_schema_is_the_one_served(owner):
    _token, key = services.api_token_create(actor=owner, name="schema")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    served = client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert served.status_code == 200
    assert served.json()["paths"].keys() == RAW_SCHEMA["paths"].keys()
    assert len(RAW_SCHEMA["paths"]) >= 40


@schema.parametrize()
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@pytest.mark.django_db
def test_api_conforms_to_its_schema(case, owner_world):
    objects = owner_world["objects"]
    # Path parameters name the team's real objects, so that operations reach their code
    # beyond the 404 of an unknown id.
    for name in list(case.path_parameters or {}):
        if name in objects:
            case.path_parameters[name] = objects[name]
    may_503 = case.operation.label in MAY_ANSWER_503
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {owner_world['key']}", "Accept-Language": "en"},
        checks=CONFORMANCE if may_503 else [not_a_server_error, *CONFORMANCE],
    )
    if may_503:
        assert response.status_code < 500 or response.status_code == 503, response.text
