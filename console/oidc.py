"""Login with the enterprise's single sign-on (OpenID Connect): mozilla-django-oidc does the
code flow (state, nonce, PKCE, the ID token's signature against the provider's keys); this
module adds what is the platform's:

- the provider's endpoints from its discovery document (``OIDC_ISSUER``), whose issuer must be
  the one configured; the ID token's issuer and audience checked too;
- accounts found by the provider's subject (``ExternalAccount``), never by name or email: a
  person whose name is a local account's (or another provider's) is refused, not merged;
- at every login: names, email, display name, site staff (``OIDC_STAFF_GROUP``) and the
  memberships ``OIDC_TEAM_MAP`` maps the person's groups to (console/identity.py);
- logout at the provider too (its ``end_session_endpoint``), so that the next login asks again.

A provider that cannot be reached refuses the single sign-on with a message on the login page;
local and directory logins go on.
"""

import logging
import re
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from console.identity import memberships_apply, parse_team_map
from console.models import ExternalAccount

logger = logging.getLogger(__name__)

ACTOR = "single sign-on"  # the audit log's actor for what a login through it changes
OIDC = ExternalAccount.Source.OIDC
TIMEOUT_S = 10
_discovered: dict[str, dict] = {}


def enabled() -> bool:
    return bool(settings.OIDC_ISSUER)


def _verify() -> str | bool:
    return settings.OIDC_CA_FILE or True


def discovery() -> dict:
    """The provider's discovery document (fetched once per issuer)."""
    issuer = settings.OIDC_ISSUER
    if issuer not in _discovered:
        response = requests.get(
            f"{issuer}/.well-known/openid-configuration", timeout=TIMEOUT_S, verify=_verify()
        )
        response.raise_for_status()
        document = response.json()
        if str(document.get("issuer", "")).rstrip("/") != issuer:
            raise ImproperlyConfigured(
                f"the provider at OIDC_ISSUER says its issuer is {document.get('issuer')!r}"
            )
        _discovered[issuer] = document
    return _discovered[issuer]


# mozilla-django-oidc's settings, from the platform's OIDC_* and the discovery document.
_SETTINGS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": lambda: discovery()["authorization_endpoint"],
    "OIDC_OP_TOKEN_ENDPOINT": lambda: discovery()["token_endpoint"],
    "OIDC_OP_USER_ENDPOINT": lambda: discovery()["userinfo_endpoint"],
    "OIDC_OP_JWKS_ENDPOINT": lambda: discovery()["jwks_uri"],
    "OIDC_RP_CLIENT_ID": lambda: settings.OIDC_CLIENT_ID,
    "OIDC_RP_CLIENT_SECRET": lambda: settings.OIDC_CLIENT_SECRET,
    "OIDC_RP_SIGN_ALGO": lambda: settings.OIDC_SIGN_ALGO,
    "OIDC_RP_IDP_SIGN_KEY": lambda: None,
    "OIDC_RP_SCOPES": lambda: settings.OIDC_SCOPES,
    "OIDC_USE_PKCE": lambda: True,
    "OIDC_USE_NONCE": lambda: True,
    "OIDC_STORE_ID_TOKEN": lambda: True,
    "OIDC_TOKEN_USE_BASIC_AUTH": lambda: True,
    "OIDC_VERIFY_SSL": _verify,
    "OIDC_TIMEOUT": lambda: TIMEOUT_S,
    "LOGIN_REDIRECT_URL_FAILURE": lambda: reverse("console:login") + "?sso=failed",
    "OIDC_AUTHENTICATION_CALLBACK_URL": lambda: "console:oidc_callback",
}


def oidc_setting(attr: str, *default):
    if attr in _SETTINGS:
        return _SETTINGS[attr]()
    return import_from_settings(attr, *default)


def team_map() -> dict[str, tuple[str, str]]:
    return parse_team_map(settings.OIDC_TEAM_MAP, "OIDC_TEAM_MAP")


def _groups(claims: dict) -> set[str]:
    groups = claims.get(settings.OIDC_GROUPS_CLAIM) or []
    if isinstance(groups, str):
        groups = [groups]
    return {str(g) for g in groups if isinstance(g, str | int)}


def _setting_property(name: str) -> property:
    return property(lambda self: oidc_setting(name))


class OIDCBackend(OIDCAuthenticationBackend):
    """The login backend of the provider's callback; it answers nothing else."""

    get_settings = staticmethod(oidc_setting)
    # Read when a login comes back, not each time Django makes the backends (every login).
    OIDC_OP_TOKEN_ENDPOINT = _setting_property("OIDC_OP_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = _setting_property("OIDC_OP_USER_ENDPOINT")
    OIDC_OP_JWKS_ENDPOINT = _setting_property("OIDC_OP_JWKS_ENDPOINT")
    OIDC_RP_CLIENT_ID = _setting_property("OIDC_RP_CLIENT_ID")
    OIDC_RP_CLIENT_SECRET = _setting_property("OIDC_RP_CLIENT_SECRET")
    OIDC_RP_SIGN_ALGO = _setting_property("OIDC_RP_SIGN_ALGO")
    OIDC_RP_IDP_SIGN_KEY = _setting_property("OIDC_RP_IDP_SIGN_KEY")

    def __init__(self, *args, **kwargs) -> None:
        self.UserModel = get_user_model()
        self.subject = ""

    def authenticate(self, request, **kwargs):
        if not enabled() or request is None or "code" not in request.GET:
            return None
        try:
            return super().authenticate(request, **kwargs)
        except requests.RequestException as exc:
            logger.warning("single sign-on: the provider could not be reached: %s", exc)
            return None

    def get_user(self, user_id):
        return ModelBackend().get_user(user_id)  # active accounts only

    def verify_token(self, token, **kwargs):
        payload = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if payload.get("iss") != discovery()["issuer"]:
            raise SuspiciousOperation(f"the ID token's issuer is {payload.get('iss')!r}")
        if settings.OIDC_CLIENT_ID not in audiences:
            raise SuspiciousOperation("the ID token is not for this platform")
        self.subject = str(payload.get("sub") or "")
        return payload

    def verify_claims(self, claims) -> bool:
        # The user info must be of the person the ID token names (OpenID Connect, 5.3.4).
        return bool(self.subject) and str(claims.get("sub")) == self.subject

    def filter_users_by_claims(self, claims):
        return self.UserModel.objects.filter(
            external_account__source=OIDC, external_account__subject=_subject(claims)
        )

    @transaction.atomic
    def create_user(self, claims) -> AbstractBaseUser:
        username = _username(claims)
        if self.UserModel.objects.filter(username__iexact=username).exists():
            # A local account, or another identity's: never taken over by a name.
            raise SuspiciousOperation(f"{username!r} is already another account's name")
        user = self.UserModel.objects.create_user(username=username)  # no usable password
        ExternalAccount.objects.create(user=user, source=OIDC, subject=_subject(claims))
        return sso_apply(user, claims)

    def update_user(self, user, claims) -> AbstractBaseUser:
        return sso_apply(user, claims)


def _subject(claims: dict) -> str:
    return f"{discovery()['issuer']}|{claims['sub']}"


def _username(claims: dict) -> str:
    """The account's name: the provider's ``OIDC_USERNAME_CLAIM`` (else the email's local
    part), in the characters Django's usernames allow."""
    raw = str(claims.get(settings.OIDC_USERNAME_CLAIM) or "")
    if not raw and claims.get("email"):
        raw = str(claims["email"]).split("@")[0]
    username = re.sub(r"[^\w.@+-]", "", raw)[:150]
    if not username:
        raise SuspiciousOperation(f"no usable {settings.OIDC_USERNAME_CLAIM} claim")
    return username


@transaction.atomic
def sso_apply(user: AbstractBaseUser, claims: dict) -> AbstractBaseUser:
    """The account as the provider describes it at this login."""
    user.first_name = str(claims.get("given_name") or user.first_name)[:150]
    user.last_name = str(claims.get("family_name") or user.last_name)[:150]
    user.email = str(claims.get("email") or user.email)[:254]
    groups = _groups(claims)
    if settings.OIDC_STAFF_GROUP:
        user.is_staff = settings.OIDC_STAFF_GROUP.lower() in {g.lower() for g in groups}
    user.save()
    ExternalAccount.objects.filter(user=user).update(
        display_name=str(claims.get("name") or "")[:150], synced_at=timezone.now()
    )
    memberships_apply(user, groups, team_map(), by=ACTOR)
    return user


class OIDCLogin(OIDCAuthenticationRequestView):
    """``/oidc/authenticate/``: to the provider's login page."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args, **kwargs) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not enabled():
            raise Http404
        try:
            self.OIDC_OP_AUTH_ENDPOINT = oidc_setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except (requests.RequestException, ValueError, KeyError) as exc:
            logger.warning("single sign-on: the provider could not be reached: %s", exc)
            messages.error(request, _("The single sign-on cannot be reached; try again later."))
            return redirect("console:login")
        self.OIDC_RP_CLIENT_ID = settings.OIDC_CLIENT_ID
        return super().get(request)


class OIDCCallback(OIDCAuthenticationCallbackView):
    """``/oidc/callback/``: where the provider sends the person back."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not enabled():
            raise Http404
        return super().get(request)


def end_session_url(id_token: str, after: str) -> str:
    """The provider's logout, coming back to ``after``; "" where it has none."""
    try:
        endpoint = discovery().get("end_session_endpoint")
    except (requests.RequestException, ValueError, ImproperlyConfigured):
        return ""
    if not endpoint:
        return ""
    query = urlencode(
        {
            "id_token_hint": id_token,
            "post_logout_redirect_uri": after,
            "client_id": settings.OIDC_CLIENT_ID,
        }
    )
    return f"{endpoint}?{query}"
