from django.apps import apps
from django.conf import settings
from django.http import HttpRequest
from django.urls import reverse

from console.notifications import unread_count
from console.selectors import teams_for_user
from console.services import team_create_allowed


def nav_items() -> list[tuple[str, str]]:
    """(url name, label) of every app's console pages, in INSTALLED_APPS order.

    Apps declare ``console_nav`` on their AppConfig, so the console links to them without
    importing them.
    """
    return [
        item for config in apps.get_app_configs() for item in getattr(config, "console_nav", [])
    ]


# Pages every member of any team may open, besides the apps' (the audit log is owners' only).
MEMBER_PAGES = ("console:members", "console:usage", "console:notifications")


def switch_target(request: HttpRequest) -> str:
    """The URL name the team switcher opens in another team: the section this page belongs to
    (the list whose address this page's starts with: a job's page is in the jobs), else the
    other team's dashboard."""
    team = getattr(request, "team", None)
    if team is None:
        return "console:dashboard"
    best, length = "console:dashboard", 0
    for url_name in [name for name, _label in nav_items()] + list(MEMBER_PAGES):
        prefix = reverse(url_name, kwargs={"team": team.slug})
        if request.path.startswith(prefix) and len(prefix) > length:
            best, length = url_name, len(prefix)
    return best


def console(request: HttpRequest) -> dict:
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        # The login page names the ways in.
        return {
            "directory_login": bool(settings.LDAP_SERVER_URI),
            "sso_login": bool(settings.OIDC_ISSUER),
            "sso_name": settings.OIDC_PROVIDER_NAME,
        }
    membership = getattr(request, "membership", None)
    return {
        "my_teams": teams_for_user(request.user),
        "current_team": getattr(request, "team", None),
        "current_membership": membership,
        # The bell: what the team was told since the member last looked.
        "unread_notifications": unread_count(membership) if membership is not None else 0,
        "nav_items": nav_items(),
        "switch_to": switch_target(request),
        "can_create_team": team_create_allowed(request.user),
    }
