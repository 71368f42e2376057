"""The connection to Label Studio: the SDK client, and its health for the dashboard.

The client is ``label_studio_sdk.client.LabelStudio`` with the platform's personal access
token; it refreshes the short-lived access token itself.
"""

import base64
import hashlib
import hmac
from functools import lru_cache

import httpx
from django.conf import settings
from django.utils.translation import gettext as _
from label_studio_sdk.client import LabelStudio

from console.health import Check


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


def client() -> LabelStudio:
    if not settings.LABEL_STUDIO_URL:
        raise NotConfigured(_("LABEL_STUDIO_URL is not set."))
    return _client(settings.LABEL_STUDIO_URL, token())


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
    digest = hmac.new(
        settings.SECRET_KEY.encode(), f"label-studio:{user.pk}".encode(), hashlib.sha256
    ).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


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


def login_session(user) -> str:
    """A Label Studio session for ``user``'s account, made on first use through Label Studio's
    invite sign-up (its user API cannot set a password). An account that exists already (a
    platform database restored, a Label Studio reused) is logged in to."""
    from labeling.models import LabelStudioAccount

    email, password = _email(user), _password(user)
    with httpx.Client(base_url=settings.LABEL_STUDIO_URL, timeout=15) as http:
        account = LabelStudioAccount.objects.filter(user=user).first()
        if account is None:
            invite = httpx.get(
                f"{settings.LABEL_STUDIO_URL}/api/invite",
                timeout=15,
                headers=client()._client_wrapper.get_headers(),
            ).json()
            _form_post(
                http,
                invite["invite_url"],
                {"email": email, "password": password, "allow_newsletters": "false"},
            )
        me = _whoami(http)
        if me is None or me.get("email") != email:
            http.cookies.clear()
            _form_post(http, "/user/login/", {"email": email, "password": password})
            me = _whoami(http)
        if me is None or me.get("email") != email:
            raise NotConfigured(_("Label Studio refused the login of %(user)s.") % {"user": user})
        if account is None:
            client().users.update(id=me["id"], first_name=user.get_username())
            LabelStudioAccount.objects.update_or_create(
                user=user, defaults={"ls_user_id": me["id"], "email": email}
            )
        return http.cookies[SESSION_COOKIE]
