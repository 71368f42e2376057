"""Every console page renders for an owner, in both languages, with no asset from outside."""

import re

import pytest
from django.urls import reverse

from tests.helpers.routes import routes

EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["'](?:https?:)?//""", re.I)
PAGES = [
    r
    for r in routes()
    if not r.is_api
    and r.kwargs in ((), ("team",))
    # Not pages: a POST, the single sign-on's redirects (tests/test_sso.py), Prometheus's
    # figures (tests/test_prometheus.py).
    and r.name
    not in {
        "console:logout",
        "set_language",
        "console:oidc_login",
        "console:oidc_callback",
        "metrics",
    }
]


@pytest.mark.parametrize("language", ["zh-hans", "en"])
@pytest.mark.parametrize("route", PAGES, ids=str)
def test_page_renders_with_local_assets_only(client, make_user, team, owner, route, language):
    owner.is_staff = True
    owner.save()
    client.force_login(owner)
    client.cookies["django_language"] = language
    url = reverse(route.name, kwargs={"team": team.slug} if route.kwargs else {})
    response = client.get(url, follow=True)
    assert response.status_code == 200, url
    html = response.content.decode()
    assert not EXTERNAL.search(html), f"{url} links an outside asset"
    for asset in re.findall(r"""(?:src|href)="(/static/[^"]+)\"""", html):
        assert client.get(asset).status_code == 200, asset


def test_another_teams_page_is_a_friendly_404(client, make_user, team):
    client.force_login(make_user("outsider"))
    response = client.get(reverse("console:dashboard", kwargs={"team": team.slug}))
    assert response.status_code == 404
    assert "此页面不存在，或属于您未加入的团队。" in response.content.decode()
    assert team.name not in response.content.decode()


def test_a_refused_write_explains_the_role(client, make_user, team):
    from console.models import Membership

    viewer = make_user("viewer")
    Membership.objects.create(team=team, user=viewer, role="viewer")
    client.force_login(viewer)
    response = client.post(reverse("console:members", kwargs={"team": team.slug}))
    assert response.status_code == 403
    assert "您在此团队中的角色不允许此操作" in response.content.decode()
