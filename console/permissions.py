"""Team scoping and role checks, one mechanism for console views and the REST API.

A team-scoped route takes the team's slug as its ``team`` URL argument. The request's user must
be a member (else 404, as if the team did not exist), and the member's role must allow the
permission that the route names for reads or for writes (else 403). What a role allows is
``console.roles.PERMISSIONS``.
"""

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.utils import timezone
from rest_framework import exceptions, permissions

from console.models import Membership
from console.roles import Perm, role_allows
from console.selectors import membership_for

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# The team of the session's last team page: where the console opens (console.views.home).
LAST_TEAM_SESSION_KEY = "last_team"


def check_team_access(
    request: HttpRequest, team_slug: str, read: Perm, write: Perm | None
) -> Membership:
    """404 unless a member; 403 unless the role allows this method's permission."""
    membership = membership_for(request.user, team_slug)
    request.team = membership.team
    request.membership = membership
    needed = read if request.method in SAFE_METHODS else write
    if needed is not None and not role_allows(membership.role, needed):
        raise PermissionDenied
    return membership


def team_view(*, read: Perm = Perm.TEAM_VIEW, write: Perm | None = None) -> Callable:
    """Decorate a console view taking ``team``: login, membership and the role's permission.

    A view without a ``write`` permission is read-only and answers writes with 405.
    """

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, team: str, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            membership = check_team_access(request, team, read, write)
            if request.method not in SAFE_METHODS and write is None:
                return HttpResponseNotAllowed(SAFE_METHODS)
            remember_team(request, membership)
            return view(request, **kwargs)

        return wrapped

    return decorator


def remember_team(request: HttpRequest, membership: Membership) -> None:
    """The team whose page this is, kept in the session and, once per change of team, on the
    membership (one write when the user moves between teams, none per page), so that the next
    login opens it too."""
    if request.session.get(LAST_TEAM_SESSION_KEY) == membership.team.slug:
        return
    request.session[LAST_TEAM_SESSION_KEY] = membership.team.slug
    Membership.objects.filter(pk=membership.pk).update(last_visited_at=timezone.now())


class TeamPermission(permissions.BasePermission):
    """DRF: the view names ``read_permission`` and ``write_permission``; the URL has ``team``.

    A view without ``write_permission`` refuses every write with 403.
    """

    def has_permission(self, request, view) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        membership = check_team_access(
            request,
            view.kwargs["team"],
            getattr(view, "read_permission", Perm.TEAM_VIEW),
            getattr(view, "write_permission", None),
        )
        if request.method not in SAFE_METHODS and getattr(view, "write_permission", None) is None:
            raise PermissionDenied
        return membership is not None


class StaffOnly(permissions.BasePermission):
    """DRF: site staff only. To any other account a route that names an account does not
    exist (404, as the console's staff pages); a route that names none is refused (403)."""

    def has_permission(self, request, view) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        if not request.user.is_staff and view.kwargs:
            raise exceptions.NotFound
        return bool(request.user.is_staff)
