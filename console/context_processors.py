from django.apps import apps
from django.conf import settings
from django.http import HttpRequest

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
        "can_create_team": team_create_allowed(request.user),
    }
