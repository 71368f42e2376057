"""The connection to Label Studio: the SDK clients, its health for the dashboard, and the
annotators' accounts and the login hand-off.

``client()`` is ``label_studio_sdk.client.LabelStudio`` with the platform's personal access
token (it refreshes the short-lived access token itself): health and versions only.
``client(team)`` is the team's service account in the team's own organisation: every project,
task, annotation and webhook of the team (``label_studio_admin`` makes the organisation).
"""

import logging
import time
from functools import lru_cache

import httpx
import redis
from django.conf import settings
from django.utils.translation import gettext as _
from label_studio_sdk.client import LabelStudio

from console.health import Check, redis_client
from labeling import label_studio_admin

logger = logging.getLogger(__name__)


class NotConfigured(RuntimeError):
    pass


def token() -> str:
    if settings.LABEL_STUDIO_TOKEN:
        return settings.LABEL_STUDIO_TOKEN
    try:
        return settings.LABEL_STUDIO_TOKEN_FILE.read_text().strip()
    except FileNotFoundError:
        raise NotConfigured(
            _(
                "No token for Label Studio: set LABEL_STUDIO_TOKEN, or wait for the Label Studio "
                "that `make run` starts to write %(file)s."
            )
            % {"file": settings.LABEL_STUDIO_TOKEN_FILE}
        ) from None


@lru_cache(maxsize=4)
def _client(url: str, api_key: str) -> LabelStudio:
    return LabelStudio(base_url=url, api_key=api_key, timeout=30)


def client(team=None) -> LabelStudio:
    """The platform's client: with ``team``, as the team's service account, whose every call
    is scoped to the team's organisation (projects, tasks, webhooks); without, as Label
    Studio's administrator (health, versions)."""
    if not settings.LABEL_STUDIO_URL:
        raise NotConfigured(_("LABEL_STUDIO_URL is not set."))
    if team is None:
        return _client(settings.LABEL_STUDIO_URL, token())
    team_ensure(team)
    return _client(settings.LABEL_STUDIO_URL, label_studio_admin.team_token(team.pk))


_teams_ready: dict[tuple[str, int, str], float] = {}
TEAM_CHECK_S = 300


def team_ensure(team) -> None:
    """The team's organisation exists and its service account takes the platform's token:
    checked every few minutes per process (one request); made through Label Studio's Django
    when not (a new team, a Label Studio started afresh)."""
    key = (settings.LABEL_STUDIO_URL, team.pk, label_studio_admin.team_token(team.pk))
    if time.monotonic() - _teams_ready.get(key, -TEAM_CHECK_S) < TEAM_CHECK_S:
        return
    response = httpx.get(
        f"{settings.LABEL_STUDIO_URL}/api/current-user/whoami",
        headers={"Authorization": f"Token {key[2]}"},
        timeout=15,
    )
    if response.status_code != 200 or response.json().get("email") != (
        f"team-{team.pk}@{settings.LABEL_STUDIO_ACCOUNT_DOMAIN}"
    ):
        try:
            label_studio_admin.team_ensure(team)
        except label_studio_admin.AdminError as exc:
            raise NotConfigured(str(exc)) from exc
    _teams_ready[key] = time.monotonic()


def _waiting() -> str:
    """What waits for Label Studio: projects not pushed yet."""
    from django.db import DatabaseError

    from labeling.models import LabelingProject

    try:
        n = LabelingProject.objects.exclude(status=LabelingProject.Status.READY).count()
    except DatabaseError:  # the database has its own health line
        return ""
    return _(" · %(n)d labeling project(s) waiting to be pushed") % {"n": n} if n else ""


def check_health() -> Check:
    """Label Studio answers, and accepts the platform's token; when not, what waits for it."""
    name = "labelstudio"
    if not settings.LABEL_STUDIO_URL:
        return Check(name, False, _("LABEL_STUDIO_URL is not set.") + _waiting())
    try:
        response = httpx.get(f"{settings.LABEL_STUDIO_URL}/health", timeout=2)
        if response.status_code != 200:
            return Check(
                name, False, f"{settings.LABEL_STUDIO_URL}: HTTP {response.status_code}{_waiting()}"
            )
        version = client().versions.get()
    except NotConfigured as exc:
        return Check(name, False, str(exc) + _waiting())
    except Exception as exc:  # down, refused, token rejected…: any failure is the answer
        return Check(name, False, f"{settings.LABEL_STUDIO_URL}: {exc}{_waiting()}")
    release = getattr(version, "release", None) or ""
    return Check(name, True, f"Label Studio {release} · {settings.LABEL_STUDIO_URL}".strip())


# -- Accounts of annotators, and the login hand-off ------------------------------------------

SESSION_COOKIE = "sessionid"  # Label Studio's (Django's default name)


def _password(user) -> str:
    return label_studio_admin.account_password(user.pk)


def _email(user) -> str:
    # Usernames may hold characters an e-mail cannot; the id keeps it unique.
    return f"u{user.pk}@{settings.LABEL_STUDIO_ACCOUNT_DOMAIN}"


def _form_post(http: httpx.Client, path: str, data: dict) -> httpx.Response:
    http.get(path)
    return http.post(
        path,
        data={"csrfmiddlewaretoken": http.cookies.get("csrftoken", ""), **data},
        headers={"Referer": f"{settings.LABEL_STUDIO_URL}{path}"},
    )


def _whoami(http: httpx.Client) -> dict | None:
    response = http.get("/api/current-user/whoami")
    return response.json() if response.status_code == 200 else None


def labeling_teams(user) -> list:
    """The teams where ``user`` holds a labeling role: their account's organisations."""
    from console.models import Team
    from console.roles import PERMISSIONS, Perm

    if not user.is_active:
        return []
    return list(
        Team.objects.filter(
            memberships__user=user, memberships__role__in=PERMISSIONS[Perm.ANNOTATE]
        ).order_by("pk")
    )


def account_sync(user, active_team=None):
    """Make ``user``'s Label Studio account what their memberships say: a member of the
    organisations of the teams where they label (working in ``active_team``'s), or revoked
    (deactivated, tokens deleted, sessions ended) where they label nowhere. Returns the
    ``LabelStudioAccount`` (None where there is none and nothing to make)."""
    from labeling.models import LabelStudioAccount

    account = LabelStudioAccount.objects.filter(user=user).first()
    teams = labeling_teams(user)
    try:
        if not teams:
            if account is not None:
                label_studio_admin.revoke(account.email)
                LabelStudioAccount.objects.filter(pk=account.pk).update(active_team=None)
            return account
        active = active_team if active_team in teams else (account and account.active_team)
        active = active if active in teams else teams[0]
        result = label_studio_admin.member_set(
            email=_email(user),
            password=_password(user),
            name=user.get_username(),
            teams=teams,
            active=active,
        )
    except label_studio_admin.AdminError as exc:
        raise NotConfigured(str(exc)) from exc
    account, _created = LabelStudioAccount.objects.update_or_create(
        user=user,
        defaults={
            "ls_user_id": result["user"],
            "email": _email(user),
            "active_team_id": result["active"],
        },
    )
    return account


class TooManySwitches(Exception):
    """The user changed the team they label in more often than the hour allows; the next
    change is allowed in ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(retry_after)
        self.retry_after = retry_after


SWITCH_WINDOW_S = 3600


def _count_switch(user) -> None:
    """Each change of the team a user labels in is a run of Label Studio's Django (seconds),
    and those runs take turns on the host: an account alternating between two teams would hold
    up every other team's hand-off. ``LABEL_STUDIO_SWITCHES_PER_HOUR`` bounds it per user (an
    hour from the first change counted); without Redis nothing is counted."""
    # The time the user joined too: a database made again (a restore, a test run) reuses ids.
    key = f"platform:label-studio-switches:{user.pk}:{user.date_joined.timestamp():.0f}"
    try:
        with redis_client().pipeline() as pipe:
            pipe.incr(key).expire(key, SWITCH_WINDOW_S, nx=True).ttl(key)
            count, _set, ttl = pipe.execute()
    except redis.RedisError as exc:
        logger.warning("team switches of user %s not counted: %s", user.pk, exc)
        return
    if count > settings.LABEL_STUDIO_SWITCHES_PER_HOUR:
        raise TooManySwitches(max(int(ttl), 1))


def login_session(user, team) -> str:
    """A Label Studio session for ``user``'s own account, working in ``team``'s organisation.

    The account is made (and put in the organisations of the teams where the user labels)
    through Label Studio's Django on first use or when the user changes team (``TooManySwitches``
    past the hour's limit); then the platform logs in with the account's password, derived from
    ``SECRET_KEY`` and never shown."""
    from labeling.models import LabelStudioAccount

    email, password = _email(user), _password(user)
    account = LabelStudioAccount.objects.filter(user=user).first()
    if account is None or account.active_team_id != team.pk:
        if account is not None:
            _count_switch(user)
        account = account_sync(user, active_team=team)
    with httpx.Client(base_url=settings.LABEL_STUDIO_URL, timeout=15) as http:
        _form_post(http, "/user/login/", {"email": email, "password": password})
        me = _whoami(http)
        if me is None or me.get("email") != email:
            # The account changed under the platform (restored, SECRET_KEY changed): set again.
            account_sync(user, active_team=team)
            http.cookies.clear()
            _form_post(http, "/user/login/", {"email": email, "password": password})
            me = _whoami(http)
        if me is None or me.get("email") != email:
            raise NotConfigured(_("Label Studio refused the login of %(user)s.") % {"user": user})
        return http.cookies[SESSION_COOKIE]


def sessions_end(user) -> None:
    """End every Label Studio session of ``user``'s account and delete its API tokens (the
    console's logout, a password change)."""
    from labeling.models import LabelStudioAccount

    account = LabelStudioAccount.objects.filter(user=user).first()
    if account is not None:
        label_studio_admin.end_sessions(account.email, _password(user))
