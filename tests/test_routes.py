"""Every route of the platform, enumerated from the URLconf, so that a route added later is
covered without a new test: login is required, another team's objects are 404, viewers cannot
write. A new URL argument must be given a factory in
``tests.helpers.routes.object_factories``; until then these tests fail and name it."""

from dataclasses import dataclass

import pytest
from django.urls import reverse

from console import services
from console.models import Membership
from console.roles import Role
from tests.helpers.routes import Route, object_factories, routes

# Routes anyone may call without logging in.
# The single sign-on's pages (console/oidc.py) exist only where it is configured (404 else).
PUBLIC = {
    "console:login",
    "console:logout",
    "console:oidc_login",
    "console:oidc_callback",
    "set_language",
    "labeling:label_studio_webhook",
    # Prometheus's: the metrics token or the allowed networks instead of a login
    # (tests/security/test_metrics.py).
    "metrics",
}
WRITE_METHODS = ("post", "put", "patch", "delete")


ROUTES = routes()
TEAM_ROUTES = [r for r in ROUTES if r.team_scoped]


@dataclass
class World:
    """Two teams; `mine` is the one the user under test is in."""

    mine: object
    other: object
    objects: dict  # (team slug, kwarg) -> value


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


# Each test tries every route on one world (two teams and their objects), collecting the
# failures: a world per route made 600 worlds, most of these tests' time.


def test_every_route_requires_login(client, world):
    failures = []
    for route in ROUTES:
        if route.name in PUBLIC:
            continue
        url = url_for(route, world, world.mine)
        for method in ("get", "post"):
            response = getattr(client, method)(url)
            if route.is_api:
                ok = response.status_code in (401, 403)
            else:
                ok = response.status_code == 302 and response["Location"].startswith(
                    reverse("console:login")
                )
            if not ok:
                failures.append((route.name, method, response.status_code))
    assert failures == []


def log_in_member(client, make_user, team, username: str, role: Role) -> None:
    """A new user, ``role`` in ``team``, logged in on ``client``."""
    user = make_user(username)
    Membership.objects.create(team=team, user=user, role=role)
    client.force_login(user)


def test_another_teams_routes_are_404(client, make_user, world):
    log_in_member(client, make_user, world.mine, "outsider", Role.OWNER)
    failures = []
    for route in TEAM_ROUTES:
        url = url_for(route, world, world.other)
        for method in ("get", *WRITE_METHODS):
            if (code := getattr(client, method)(url).status_code) != 404:
                failures.append((route.name, method, code))
    assert failures == []


def test_another_teams_objects_are_404_in_my_team(client, world):
    """The team in the URL is mine, but the object named in it belongs to the other team."""
    me = Membership.objects.get(team=world.mine, role=Role.OWNER).user
    client.force_login(me)
    failures = []
    for route in ROUTES:
        if len(route.kwargs) <= (1 if route.team_scoped else 0):
            continue
        url = url_for(route, world, world.mine, objects_of=world.other)
        statuses = {m: getattr(client, m)(url).status_code for m in ("get", *WRITE_METHODS)}
        # 405 for a method the route lacks; every method it has must answer 404.
        if not set(statuses.values()) <= {404, 405} or 404 not in statuses.values():
            failures.append((route.name, statuses))
    assert failures == []


def test_viewers_cannot_write(client, make_user, world):
    log_in_member(client, make_user, world.mine, "viewer", Role.VIEWER)
    before = list(Membership.objects.order_by("pk").values_list("pk", "role"))
    failures = []
    for route in TEAM_ROUTES:
        url = url_for(route, world, world.mine)
        for method in WRITE_METHODS:
            response = getattr(client, method)(
                url, {"role": "owner", "username": "viewer"}, content_type="application/json"
            )
            if response.status_code not in (403, 405):
                failures.append((route.name, method, response.status_code))
    assert failures == []
    assert list(Membership.objects.order_by("pk").values_list("pk", "role")) == before


def test_console_writes_need_the_csrf_token(world):
    """With a session (a browser), no write passes without the CSRF token; tokens in headers
    (the API's Bearer keys) are not exposed to cross-site requests and need none."""
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    me = Membership.objects.get(team=world.mine, role=Role.OWNER).user
    client.force_login(me)
    failures = []
    for route in ROUTES:
        if route.name in PUBLIC:
            continue
        url = url_for(route, world, world.mine)
        for method in WRITE_METHODS:
            if (code := getattr(client, method)(url).status_code) not in (403, 405):
                failures.append((route.name, method, code))
    assert failures == []


# Routes where an annotator may write. Annotators label in Label Studio, so none on the
# platform; a route that lets them must be named here, on purpose.
ANNOTATOR_WRITES: set[str] = set()
# What only the other team's objects show: its owner's name and its endpoint's.
OTHER_TEAM_MARKERS = ("boss-b", "ep-other")


def _as(user, route: Route, key: str):
    """A client acting as ``user``: a Bearer API token for the API, a session for pages."""
    from django.test import Client

    if route.is_api:
        return Client(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_ACCEPT_LANGUAGE="en")
    client = Client(HTTP_ACCEPT_LANGUAGE="en")
    client.force_login(user)
    return client


def test_annotators_write_nothing_and_see_no_other_team(make_user, world):
    """Every team route, tried by an annotator of `mine`: writes refused (403, or 405 where the
    route takes none), reads never a server error nor another team's data, and every route of
    the other team 404. One world for all routes: a loop, and the failures listed together."""
    from console.models import AuditEvent

    annotator = make_user("annie")
    Membership.objects.create(team=world.mine, user=annotator, role=Role.ANNOTATOR)
    _token, key = services.api_token_create(actor=annotator, name="annie")
    clients = {api: _as(annotator, Route("x", (), "api/" if api else ""), key) for api in (1, 0)}
    before = (
        AuditEvent.objects.count(),
        list(Membership.objects.order_by("pk").values_list("pk", "role")),
    )
    failures = []
    body = {"role": "owner", "username": "annie", "name": "x"}
    for route in TEAM_ROUTES:
        client = clients[route.is_api]
        url = url_for(route, world, world.mine)
        if route.name not in ANNOTATOR_WRITES:
            for method in WRITE_METHODS:
                code = getattr(client, method)(url, body, content_type="application/json")
                if code.status_code not in (403, 405):
                    failures.append((route.name, method, code.status_code))
        read = client.get(url)
        content = b"".join(read.streaming_content) if read.streaming else read.content
        if read.status_code >= 500 or any(m.encode() in content for m in OTHER_TEAM_MARKERS):
            failures.append((route.name, "get", read.status_code))
        theirs = url_for(route, world, world.other)
        for method in ("get", *WRITE_METHODS):
            if (code := getattr(client, method)(theirs).status_code) != 404:
                failures.append((route.name, f"{method} (other team)", code))
    assert failures == []
    # Nothing was written: every write of a service records an audit event.
    assert before == (
        AuditEvent.objects.count(),
        list(Membership.objects.order_by("pk").values_list("pk", "role")),
    )


def test_annotators_get_no_other_users_objects(make_user, world):
    """Routes outside teams that name another user's object (a token, an account): 403/404."""
    annotator = make_user("annie")
    Membership.objects.create(team=world.mine, user=annotator, role=Role.ANNOTATOR)
    _token, key = services.api_token_create(actor=annotator, name="annie")
    failures = []
    for route in ROUTES:
        if route.team_scoped or not route.kwargs or route.name in PUBLIC:
            continue
        client = _as(annotator, route, key)
        url = url_for(route, world, world.mine)
        for method in ("get", *WRITE_METHODS):
            if (code := getattr(client, method)(url).status_code) not in (403, 404, 405):
                failures.append((route.name, method, code))
    assert failures == []


def test_expired_and_revoked_tokens_get_nothing(world):
    """Every route, with the team owner's token once it expired and once it was revoked: the
    API answers 401 with a reason and no data; pages ignore tokens and ask for a login."""
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from console.models import ApiToken, AuditEvent

    boss = Membership.objects.get(team=world.mine, role=Role.OWNER).user
    expired, expired_key = services.api_token_create(actor=boss, name="expired")
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(days=1))
    revoked, revoked_key = services.api_token_create(actor=boss, name="revoked")
    services.api_token_revoke(actor=boss, token=revoked)
    events = AuditEvent.objects.count()
    failures = []
    for key, reason in ((expired_key, "expired on"), (revoked_key, "revoked")):
        client = Client(HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_ACCEPT_LANGUAGE="en")
        for route in ROUTES:
            if route.name in PUBLIC:
                continue
            url = url_for(route, world, world.mine)
            for method in ("get", "post", "delete") if route.is_api else ("get",):
                response = getattr(client, method)(url)
                if route.is_api:
                    ok = response.status_code == 401
                    # JSON (but for the Swagger page's HTML): the reason, and nothing else.
                    if response["Content-Type"].startswith("application/json"):
                        detail = response.json()
                        ok = ok and set(detail) == {"detail"} and reason in detail["detail"]
                else:
                    ok = response.status_code == 302 and response["Location"].startswith(
                        reverse("console:login")
                    )
                if not ok:
                    failures.append((reason, route.name, method, response.status_code))
    assert failures == []
    assert AuditEvent.objects.count() == events
