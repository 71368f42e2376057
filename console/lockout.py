"""Password and token guessing, throttled by django-axes: the platform's side of it.

django-axes counts failures in its ``AccessAttempt`` table (one row per account, address and
user agent, with a count and the time of the last failure) and refuses a login whose account or
address has ``LOGIN_FAILURE_LIMIT`` failures within ``LOGIN_LOCKOUT_MINUTES``:

- a failed login counts against the account it named (from any address) and against the
  address (for any account);
- an unknown API token names no account: it counts against its address only. An expired or
  revoked token is no guess (its holder had it): it gets its 401 with the reason and counts
  nothing, so that a forgotten script does not lock its machine out.

A try while locked out is refused, even with the right password, and is not counted (the time
the answer names holds). The answer is a 429 with ``Retry-After`` and the time in words: the
login page for a browser, JSON for the API. Lockouts are in the audit log (``login.locked``);
site staff list and lift them on the Accounts page or through the API.
"""

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from axes.backends import AxesStandaloneBackend
from axes.handlers.proxy import AxesProxyHandler
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.translation import gettext as _
from rest_framework import exceptions

# What axes is told of an unknown API token: no account, and that it was a token.
TOKEN_KIND = "token"  # noqa: S105 - a marker, not a secret


def cool_off(request: HttpRequest | None = None) -> timedelta:
    """AXES_COOLOFF_TIME: how long failures count, and a lockout lasts after the last one."""
    return timedelta(minutes=settings.LOGIN_LOCKOUT_MINUTES)


def failure_limit(request: HttpRequest | None = None, credentials: dict | None = None) -> int:
    """AXES_FAILURE_LIMIT."""
    return settings.LOGIN_FAILURE_LIMIT


def _is_token(credentials: dict | None) -> bool:
    return bool(credentials) and credentials.get("kind") == TOKEN_KIND


def lockout_parameters(request_or_attempt, credentials: dict | None = None) -> list[str]:
    """AXES_LOCKOUT_PARAMETERS: the account and the address, each on its own; only the address
    for what names no account (an unknown token)."""
    if _is_token(credentials) or (credentials is not None and not credentials.get("username")):
        return ["ip_address"]
    return ["username", "ip_address"]


class LockoutBackend(AxesStandaloneBackend):
    """Refuses a login from a locked account or address (first of AUTHENTICATION_BACKENDS).
    A call without a request (a management command, the test client's ``login()``) comes from
    no address and is not throttled."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def _lifted_at(rows: list[tuple[datetime, int]], limit: int, window: timedelta) -> datetime | None:
    """When failures ``rows`` (time of the last failure, count), within the window, fall below
    ``limit``: each row stops counting ``window`` after its time. None: not locked."""
    rows = sorted(rows)
    total = sum(n for _t, n in rows)
    if total < limit:
        return None
    for time, n in rows:
        total -= n
        if total < limit:
            return time + window
    return None  # not reached: total < limit after the last row


def retry_at(request: HttpRequest, credentials: dict | None) -> datetime | None:
    """When the lockout of this request's account or address ends; None when not locked."""
    AxesProxyHandler.update_request(request)
    window, limit = cool_off(request), failure_limit(request, credentials)
    since = timezone.now() - window
    values = {
        "username": (credentials or {}).get("username"),
        "ip_address": request.axes_ip_address,
    }
    ends = []
    for parameter in lockout_parameters(request, credentials):
        rows = AccessAttempt.objects.filter(
            **{parameter: values[parameter]}, attempt_time__gte=since
        ).values_list("attempt_time", "failures_since_start")
        if (end := _lifted_at(list(rows), limit, window)) is not None:
            ends.append(end)
    return max(ends, default=None)


def lockout_message(until: datetime) -> str:
    minutes = max(1, math.ceil((until - timezone.now()).total_seconds() / 60))
    return _(
        "Too many failed sign-ins for this account or from this address. Try again after "
        "%(time)s (in %(minutes)d minutes), or ask a site administrator to unlock it."
    ) % {"time": timezone.localtime(until).strftime("%Y-%m-%d %H:%M"), "minutes": minutes}


def _seconds_until(until: datetime) -> int:
    return max(1, math.ceil((until - timezone.now()).total_seconds()))


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None, credentials: dict | None
) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: 429 with Retry-After and when to try again; JSON for the API,
    the login page for a browser."""
    until = retry_at(request, credentials) or timezone.now() + cool_off(request)
    message = lockout_message(until)
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": message}, status=429)
    else:
        form = AuthenticationForm(request)
        if credentials and credentials.get("username"):
            form.initial["username"] = credentials["username"]
        context = {"form": form, "lockout": message, "next": request.POST.get("next", "")}
        response = render(request, "console/login.html", context, status=429)
    response["Retry-After"] = str(_seconds_until(until))
    return response


class LockedOut(exceptions.APIException):
    """The API's answer to a locked-out address (DRF adds Retry-After from ``wait``)."""

    status_code = 429
    default_code = "locked_out"

    def __init__(self, until: datetime) -> None:
        self.wait = _seconds_until(until)
        super().__init__(lockout_message(until))


def token_failed(request: HttpRequest) -> None:
    """An unknown API token came from ``request``'s address: count it; raises LockedOut when
    the address is (now) locked out."""
    credentials = {"username": None, "kind": TOKEN_KIND}
    if not AxesProxyHandler.is_allowed(request, credentials):
        raise LockedOut(retry_at(request, credentials) or timezone.now())
    user_login_failed.send(sender=LockedOut, credentials=credentials, request=request)
    if getattr(request, "axes_locked_out", False):
        raise LockedOut(retry_at(request, credentials) or timezone.now())


# -- What site staff see and lift ----------------------------------------------------------------


@dataclass(frozen=True)
class Lockout:
    kind: str  # "account" or "address"
    value: str
    failures: int
    until: datetime


def active_lockouts() -> list[Lockout]:
    """The accounts and addresses locked out now, latest end first."""
    window, limit = cool_off(), failure_limit()
    since = timezone.now() - window
    rows = AccessAttempt.objects.filter(attempt_time__gte=since).values_list(
        "username", "ip_address", "attempt_time", "failures_since_start"
    )
    groups: dict[tuple[str, str], list[tuple[datetime, int]]] = {}
    for username, address, time, n in rows:
        if username:
            groups.setdefault(("account", username), []).append((time, n))
        if address:
            groups.setdefault(("address", address), []).append((time, n))
    found = []
    for (kind, value), failures in groups.items():
        if (until := _lifted_at(failures, limit, window)) is not None:
            found.append(Lockout(kind, value, sum(n for _t, n in failures), until))
    return sorted(found, key=lambda lock: lock.until, reverse=True)
