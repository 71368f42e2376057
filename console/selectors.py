"""Reads shared by console views and the API; every one is scoped to a user or a team."""

from datetime import date

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet
from django.http import Http404

from console.models import ApiToken, AuditEvent, Membership, Team


def teams_for_user(user: AbstractBaseUser) -> QuerySet[Team]:
    return Team.objects.filter(memberships__user=user).order_by("name")


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
)


def team_audit_events(
    team: Team,
    *,
    action: str = "",
    actor: str = "",
    since: date | None = None,
    until: date | None = None,
) -> QuerySet[AuditEvent]:
    """The team's events, and the personal events (logins, tokens) of its members."""
    members = Membership.objects.filter(team=team)
    events = AuditEvent.objects.filter(
        Q(team=team)
        | Q(team__isnull=True, action__in=PERSONAL_ACTIONS)
        & (
            Q(actor_id__in=members.values("user_id"))
            # Failed logins name no account, only the username that was typed.
            | Q(actor__isnull=True, actor_username__in=members.values("user__username"))
        )
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
    return sorted(set(team_audit_events(team).values_list("action", flat=True)))
