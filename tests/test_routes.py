"""Every route of the platform, enumerated from the URLconf, so that a route added later is
covered without a new test: login is required, another team's objects are 404, viewers cannot
write. A new URL argument must be given a factory in ``object_factories``; until then these
tests fail and name it."""

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from console import services
from console.models import Membership
from console.roles import Role
from tests.conftest import make_version

# Routes anyone may call without logging in.
PUBLIC = {"console:login", "console:logout", "set_language", "labeling:label_studio_webhook"}
WRITE_METHODS = ("post", "put", "patch", "delete")


@dataclass(frozen=True)
class Route:
    name: str
    kwargs: tuple[str, ...]
    path: str

    @property
    def team_scoped(self) -> bool:
        return "team" in self.kwargs

    @property
    def is_api(self) -> bool:
        return self.path.startswith("api/")


def iter_routes(
    patterns=None, namespace: str = "", kwargs: tuple = (), prefix: str = ""
) -> Iterator[Route]:
    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        names = kwargs + tuple(entry.pattern.converters)
        path = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            ns = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from iter_routes(entry.url_patterns, ns, names, path)
        elif isinstance(entry, URLPattern) and entry.name:
            yield Route(f"{namespace}{entry.name}", names, path)


ROUTES = sorted(set(iter_routes()), key=lambda r: r.name)
TEAM_ROUTES = [r for r in ROUTES if r.team_scoped]


@dataclass
class World:
    """Two teams; `mine` is the one the user under test is in."""

    mine: object
    other: object
    objects: dict  # (team slug, kwarg) -> value


def object_factories(team, owner) -> dict:
    """How to make, in `team`, the object that each URL argument names."""
    from labeling import services as labeling_services
    from training import services as training_services
    from training.models import BaseModel, ModelVersion

    def version():
        dataset = labeling_services.dataset_create(
            actor=owner, team=team, name="ds", task_kind="text_classification"
        )
        return make_version(dataset, owner)

    v = version()
    job = training_services.training_job_submit(actor=owner, team=team, dataset_version=v)
    base = BaseModel.objects.create(
        team=team, name="base", backend="paddle", architecture="ernie", storage_prefix="x/"
    )
    model_version = ModelVersion.objects.create(
        team=team,
        name="ds",
        number=1,
        job=job,
        dataset_version=v,
        task_kind="text_classification",
        backend="paddle",
        runtime="paddle_inference",
        storage_prefix="y/",
    )
    upload = labeling_services.upload_create(actor=owner, team=team, filename="x.csv", size=10)
    from deployment.models import Endpoint, EndpointKey, Revision

    endpoint = Endpoint.objects.create(
        team=team, name=f"ep-{team.slug}", task_kind="text_classification"
    )
    revision = Revision.objects.create(endpoint=endpoint, number=1, model_version=model_version)
    endpoint_key = EndpointKey.objects.create(
        endpoint=endpoint, name="k", prefix="mpe_x", key_hash=f"hash-{team.slug}"
    )
    return {
        "team": lambda: team.slug,
        "membership_id": lambda: Membership.objects.filter(team=team).first().pk,
        "token_id": lambda: services.api_token_create(actor=owner, name="t")[0].pk,
        "dataset_id": lambda: v.dataset_id,
        "number": lambda: v.number,
        "job_id": lambda: v.lineage["import_job"],
        "upload_id": lambda: upload.pk,
        "kind": lambda: "original",
        "user_id": lambda: owner.pk,
        "project_id": lambda: (
            labeling_services.labeling_project_create(actor=owner, version=v, name="p").pk
        ),
        "secret": lambda: "not-the-secret",
        "training_job_id": lambda: job.pk,
        "base_model_id": lambda: base.pk,
        "model_version_id": lambda: model_version.pk,
        "endpoint_id": lambda: endpoint.pk,
        "revision_id": lambda: revision.pk,
        "endpoint_key_id": lambda: endpoint_key.pk,
    }


@pytest.fixture
def world(make_user, make_team) -> World:
    boss_a, boss_b = make_user("boss-a"), make_user("boss-b")
    mine = make_team("Mine", {boss_a: Role.OWNER})
    other = make_team("Other", {boss_b: Role.OWNER})
    objects = {}
    for team, boss in ((mine, boss_a), (other, boss_b)):
        for kwarg, factory in object_factories(team, boss).items():
            objects[team.slug, kwarg] = factory()
    return World(mine, other, objects)


def url_for(route: Route, world: World, team, objects_of=None) -> str:
    objects_of = objects_of or team
    values = {}
    for kwarg in route.kwargs:
        source = team if kwarg == "team" else objects_of
        key = (source.slug, kwarg)
        assert key[1] in {k for _, k in world.objects}, (
            f"route {route.name} takes <{kwarg}>: add a factory for it in object_factories()"
        )
        values[kwarg] = world.objects[key]
    return reverse(route.name, kwargs=values)


def test_routes_were_found():
    names = {r.name for r in ROUTES}
    assert {"console:dashboard", "api:members", "labeling:datasets"} <= names
    assert len(TEAM_ROUTES) >= 10


@pytest.mark.parametrize("route", [r for r in ROUTES if r.name not in PUBLIC], ids=str)
def test_every_route_requires_login(client, world, route):
    url = url_for(route, world, world.mine)
    for method in ("get", "post"):
        response = getattr(client, method)(url)
        if route.is_api:
            assert response.status_code in (401, 403), (method, url)
        else:
            assert response.status_code == 302, (method, url)
            assert response["Location"].startswith(reverse("console:login")), (method, url)


@pytest.mark.parametrize("route", TEAM_ROUTES, ids=str)
def test_another_teams_routes_are_404(client, make_user, world, route):
    outsider = make_user("outsider")
    Membership.objects.create(team=world.mine, user=outsider, role=Role.OWNER)
    client.force_login(outsider)
    url = url_for(route, world, world.other)
    for method in ("get", *WRITE_METHODS):
        response = getattr(client, method)(url)
        assert response.status_code == 404, (method, url, response.status_code)


@pytest.mark.parametrize(
    "route", [r for r in ROUTES if len(r.kwargs) > (1 if r.team_scoped else 0)], ids=str
)
def test_another_teams_objects_are_404_in_my_team(client, world, route):
    """The team in the URL is mine, but the object named in it belongs to the other team."""
    me = Membership.objects.get(team=world.mine, role=Role.OWNER).user
    client.force_login(me)
    url = url_for(route, world, world.mine, objects_of=world.other)
    statuses = {}
    for method in ("get", *WRITE_METHODS):
        statuses[method] = getattr(client, method)(url).status_code
    # 405 for a method the route lacks; every method it has must answer 404.
    assert set(statuses.values()) <= {404, 405}, (url, statuses)
    assert 404 in statuses.values(), (url, statuses)


@pytest.mark.parametrize("route", TEAM_ROUTES, ids=str)
def test_viewers_cannot_write(client, make_user, world, route):
    viewer = make_user("viewer")
    Membership.objects.create(team=world.mine, user=viewer, role=Role.VIEWER)
    client.force_login(viewer)
    url = url_for(route, world, world.mine)
    before = list(Membership.objects.order_by("pk").values_list("pk", "role"))
    for method in WRITE_METHODS:
        response = getattr(client, method)(
            url, {"role": "owner", "username": "viewer"}, content_type="application/json"
        )
        assert response.status_code in (403, 405), (method, url, response.status_code)
    assert list(Membership.objects.order_by("pk").values_list("pk", "role")) == before


@pytest.mark.parametrize("route", [r for r in ROUTES if r.name not in PUBLIC], ids=str)
def test_console_writes_need_the_csrf_token(world, route):
    """With a session (a browser), no write passes without the CSRF token; tokens in headers
    (the API's Bearer keys) are not exposed to cross-site requests and need none."""
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    me = Membership.objects.get(team=world.mine, role=Role.OWNER).user
    client.force_login(me)
    url = url_for(route, world, world.mine)
    for method in WRITE_METHODS:
        response = getattr(client, method)(url)
        assert response.status_code in (403, 405), (method, url, response.status_code)
