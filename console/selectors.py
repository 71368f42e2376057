"""Reads shared by console views and the API; every one is scoped to a user or a team."""

from collections.abc import Iterable
from datetime import date

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.http import Http404
from django.utils.translation import gettext as _

from console.models import ApiToken, AuditEvent, Device, Membership, Node, Team


def teams_for_user(user: AbstractBaseUser) -> QuerySet[Team]:
    return Team.objects.filter(memberships__user=user).order_by("name")


def last_visited_team(user: AbstractBaseUser) -> str | None:
    """The slug of the team whose pages the user visited last (console.permissions)."""
    return (
        Membership.objects.filter(user=user, last_visited_at__isnull=False)
        .order_by("-last_visited_at")
        .values_list("team__slug", flat=True)
        .first()
    )


def membership_for(user: AbstractBaseUser, team_slug: str) -> Membership:
    """The user's membership of the team, or 404: a team one is not in does not exist."""
    membership = (
        Membership.objects.select_related("team").filter(user=user, team__slug=team_slug).first()
        if user.is_authenticated
        else None
    )
    if membership is None:
        raise Http404("No such team.")
    return membership


def team_memberships(team: Team) -> QuerySet[Membership]:
    return Membership.objects.filter(team=team).select_related("user").order_by("user__username")


def team_membership_get(team: Team, membership_id: int) -> Membership:
    membership = team_memberships(team).filter(pk=membership_id).first()
    if membership is None:
        raise Http404("No such member.")
    return membership


def user_api_tokens(user: AbstractBaseUser) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).order_by("-created_at")


def account_get(user_id: int) -> AbstractBaseUser:
    """Any account (site staff's pages and API only)."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(pk=user_id).first()
    if user is None:
        raise Http404("No such account.")
    return user


def user_api_token_get(user: AbstractBaseUser, token_id: int) -> ApiToken:
    token = user_api_tokens(user).filter(pk=token_id).first()
    if token is None:
        raise Http404("No such token.")
    return token


# Events without a team that a team's owner may see of its members: their own sessions and
# tokens. Account administration (user.create, password.reset…) stays with site administrators.
PERSONAL_ACTIONS = (
    "login",
    "login.failed",
    "logout",
    "token.create",
    "token.revoke",
    "password.change",
    "login.locked",
)


def team_audit_events(
    team: Team,
    *,
    viewer: AbstractBaseUser | None = None,
    action: str = "",
    actor: str = "",
    since: date | None = None,
    until: date | None = None,
) -> QuerySet[AuditEvent]:
    """The team's events, and the personal events (logins, tokens) of its members from the
    moment each joined: adding an account to a team shows nothing of its past. The
    ``viewer``'s own personal events are theirs to see, from any time."""
    joined_before = Membership.objects.filter(team=team, created_at__lte=OuterRef("created_at"))
    whose = Q(Exists(joined_before.filter(user_id=OuterRef("actor_id")))) | Q(
        # Failed logins name no account, only the username that was typed.
        Exists(joined_before.filter(user__username=OuterRef("actor_username"))),
        actor__isnull=True,
    )
    if viewer is not None and viewer.is_authenticated:
        whose |= Q(actor_id=viewer.pk)
    events = AuditEvent.objects.filter(
        Q(team=team) | Q(team__isnull=True, action__in=PERSONAL_ACTIONS) & whose
    )
    if action:
        events = events.filter(action__startswith=action)
    if actor:
        events = events.filter(actor_username=actor)
    if since:
        events = events.filter(created_at__date__gte=since)
    if until:
        events = events.filter(created_at__date__lte=until)
    return events.order_by("-created_at", "-id")


def audit_actions(team: Team) -> list[str]:
    return list(
        team_audit_events(team).order_by("action").values_list("action", flat=True).distinct()
    )


def nodes_with_devices() -> QuerySet[Node]:
    return Node.objects.prefetch_related("devices").order_by("name")


def nodes_overview(user: AbstractBaseUser, nodes: Iterable[Node] | None = None) -> list[Node]:
    """Every node (or these, from ``nodes_with_devices``) with its devices, in three queries.
    What holds a device is named to members of the holder's team and to site administrators;
    others see that a device is taken."""
    teams = set(teams_for_user(user).values_list("pk", flat=True))
    nodes = list(nodes_with_devices() if nodes is None else nodes)
    for node in nodes:
        for device in node.devices.all():
            if not device.holder:
                device.shown_holder = ""
            elif user.is_staff or device.holder_team_id in teams:
                device.shown_holder = device.holder_label
            else:
                device.shown_holder = _("a job of another team")
    return nodes


def live_nodes_with(device_type: str) -> list[tuple[Node, int]]:
    """The live nodes that have ``device_type``, with how many such devices each has."""
    rows = (
        Device.objects.filter(device_type=device_type, node__stopped_at__isnull=True)
        .values("node")
        .annotate(n=Count("id"))
    )
    counts = {r["node"]: r["n"] for r in rows}
    nodes = Node.objects.filter(pk__in=counts)
    return [(node, counts[node.pk]) for node in nodes if node.alive]
