"""Login with the enterprise's directory (OpenLDAP, Active Directory) and its groups mapped to
teams: django-auth-ldap does the directory's part (binds, TLS, searches, nested groups), this
module the platform's.

- ``DirectoryBackend``: the login backend, off while ``LDAP_SERVER_URI`` is empty. Its
  settings are the platform's ``LDAP_*`` (console/settings.py). A directory entry never logs
  in as a local account of the same name (break-glass staff keep theirs).
- At every login and sync (``directory_apply``): the account's names and email are copied,
  its display name kept (``DirectoryAccount``), site staff set from ``LDAP_STAFF_GROUP``, and
  its memberships made to match ``LDAP_TEAM_MAP``: a membership from a group the person left
  goes, one from a group they joined comes, a role follows the group (the strongest where
  two groups map to one team). Memberships made in the console for unmapped teams stay.
- ``directory_sync`` (a beat task every ``LDAP_SYNC_MINUTES``): every account the directory
  provides is read again; one the directory no longer finds (removed, or disabled: not
  matching ``LDAP_USER_FILTER``) is deactivated, its sessions, tokens, Label Studio access
  and mapped teams gone. A directory that cannot be reached changes nothing.

Every change is in the audit log, by "directory".
"""

import logging
from dataclasses import dataclass, field

import ldap
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.dispatch import receiver
from django.utils import timezone
from django_auth_ldap import config
from django_auth_ldap.backend import LDAPBackend, _LDAPUser, ldap_error, populate_user
from django_auth_ldap.config import LDAPSearch, LDAPSettings

from console.identity import memberships_apply, parse_team_map
from console.models import ExternalAccount
from console.services import user_set_active

logger = logging.getLogger(__name__)

# The audit log's actor for what the directory changes.
ACTOR = "directory"
LDAP = ExternalAccount.Source.LDAP


def enabled() -> bool:
    return bool(settings.LDAP_SERVER_URI)


def team_map() -> dict[str, tuple[str, str]]:
    """``LDAP_TEAM_MAP``: group DN (lower case) → (team slug, role)."""
    return parse_team_map(settings.LDAP_TEAM_MAP, "LDAP_TEAM_MAP")


def _group_type():
    kinds = {
        "groupOfNames": config.GroupOfNamesType,
        "nested-groupOfNames": config.NestedGroupOfNamesType,
        "groupOfUniqueNames": config.GroupOfUniqueNamesType,
        "nested-groupOfUniqueNames": config.NestedGroupOfUniqueNamesType,
        "posixGroup": config.PosixGroupType,
        "activeDirectory": config.ActiveDirectoryGroupType,
        "nested-activeDirectory": config.NestedActiveDirectoryGroupType,
    }
    if settings.LDAP_GROUP_TYPE not in kinds:
        raise ImproperlyConfigured(
            f"LDAP_GROUP_TYPE {settings.LDAP_GROUP_TYPE!r} is none of {', '.join(kinds)}"
        )
    return kinds[settings.LDAP_GROUP_TYPE]()


def ldap_settings():
    """django-auth-ldap's settings, from the platform's ``LDAP_*``."""
    s = LDAPSettings()
    s.SERVER_URI = settings.LDAP_SERVER_URI
    s.START_TLS = settings.LDAP_START_TLS
    s.BIND_DN = settings.LDAP_BIND_DN
    s.BIND_PASSWORD = settings.LDAP_BIND_PASSWORD
    # Without the platform's own account, the person's bind reads their entry and groups.
    s.BIND_AS_AUTHENTICATING_USER = not settings.LDAP_BIND_DN
    options = {ldap.OPT_REFERRALS: 0, ldap.OPT_NETWORK_TIMEOUT: 10, ldap.OPT_TIMEOUT: 30}
    options[ldap.OPT_X_TLS_REQUIRE_CERT] = ldap.OPT_X_TLS_DEMAND
    if settings.LDAP_CA_FILE:
        options[ldap.OPT_X_TLS_CACERTFILE] = settings.LDAP_CA_FILE
    options[ldap.OPT_X_TLS_NEWCTX] = 0  # last: the TLS options above take effect
    s.CONNECTION_OPTIONS = options
    if settings.LDAP_USER_DN_TEMPLATE:
        s.USER_DN_TEMPLATE = settings.LDAP_USER_DN_TEMPLATE
    else:
        s.USER_SEARCH = LDAPSearch(
            settings.LDAP_USER_SEARCH_BASE, ldap.SCOPE_SUBTREE, settings.LDAP_USER_FILTER
        )
    if settings.LDAP_GROUP_SEARCH_BASE:
        s.GROUP_SEARCH = LDAPSearch(settings.LDAP_GROUP_SEARCH_BASE, ldap.SCOPE_SUBTREE)
        s.GROUP_TYPE = _group_type()
        if settings.LDAP_STAFF_GROUP:
            s.USER_FLAGS_BY_GROUP = {"is_staff": settings.LDAP_STAFF_GROUP}
    elif settings.LDAP_STAFF_GROUP or team_map():
        raise ImproperlyConfigured(
            "LDAP_STAFF_GROUP and LDAP_TEAM_MAP need LDAP_GROUP_SEARCH_BASE: where the groups are"
        )
    s.USER_ATTR_MAP = dict(settings.LDAP_USER_ATTR_MAP)
    s.CACHE_TIMEOUT = 0  # group memberships are read afresh at every login and sync
    return s


class DirectoryBackend(LDAPBackend):
    """The login backend (``AUTHENTICATION_BACKENDS``), with the platform's settings."""

    @property
    def settings(self):
        if self._settings is None:
            self._settings = ldap_settings()
        return self._settings

    def authenticate(self, request, username=None, password=None, **kwargs):
        if not enabled():
            return None
        return super().authenticate(request, username, password, **kwargs)

    def get_user(self, user_id):
        # A session's account, as the model backend finds it (active ones only): no directory
        # round trip a request; the sync ends what the directory ends.
        return ModelBackend().get_user(user_id)

    def get_or_build_user(self, username, ldap_user):
        user, built = super().get_or_build_user(username, ldap_user)
        if not built and not ExternalAccount.objects.filter(user=user, source=LDAP).exists():
            # A local account (site staff's break-glass one, say) is never taken over by a
            # directory entry that happens to have its name.
            raise ldap_user.AuthenticationFailed(f"{username!r} is a local account")
        return user, built

    def authenticate_ldap_user(self, ldap_user, password):
        user = super().authenticate_ldap_user(ldap_user, password)
        if user is not None:
            user = directory_apply(user, ldap_user)
        return user

    def populate_user(self, username):
        ldap_user = _LDAPUser(self, username=username)
        user = ldap_user.populate_user()
        if user is not None:
            user = directory_apply(user, ldap_user)
        return user


@receiver(populate_user, sender=DirectoryBackend)
def _fit_fields(sender, user: AbstractBaseUser, ldap_user, **kwargs) -> None:
    """Names and email as the directory gives them, cut to what the account's fields hold: a
    longer value must not fail the login."""
    for name in settings.LDAP_USER_ATTR_MAP:
        value = getattr(user, name, None)
        limit = user._meta.get_field(name).max_length
        if isinstance(value, str) and limit and len(value) > limit:
            setattr(user, name, value[:limit])


@transaction.atomic
def directory_apply(user: AbstractBaseUser, ldap_user) -> AbstractBaseUser:
    """The account as the directory has it now: its entry and display name, active again if
    only the directory had deactivated it, and its mapped memberships."""
    attrs = ldap_user.attrs or {}
    display = (attrs.get(settings.LDAP_ATTR_DISPLAY_NAME) or [""])[0][:150]
    account, _created = ExternalAccount.objects.update_or_create(
        user=user,
        defaults={
            "source": LDAP,
            "subject": ldap_user.dn,
            "display_name": display,
            "synced_at": timezone.now(),
        },
    )
    if account.disabled_by_directory and not user.is_active:
        user_set_active(actor=None, user=user, active=True, by=ACTOR)
        account.disabled_by_directory = False
        account.save(update_fields=["disabled_by_directory"])
    groups = ldap_user.group_dns if settings.LDAP_GROUP_SEARCH_BASE else set()
    memberships_apply(user, groups, team_map(), by=ACTOR)
    return user


@dataclass
class SyncResult:
    checked: int = 0
    deactivated: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def directory_sync() -> SyncResult:
    """Read every account the directory provides again (``LDAP_SYNC_MINUTES``)."""
    result = SyncResult()
    if not enabled():
        return result
    if not settings.LDAP_BIND_DN:
        result.errors.append("the sync reads the directory as LDAP_BIND_DN, which is not set")
        return result
    backend = DirectoryBackend()
    failed: list[str] = []

    def on_error(sender, context, user, exception, **kwargs) -> None:
        failed.append(f"{type(exception).__name__}: {exception}")

    ldap_error.connect(on_error, weak=False, dispatch_uid="directory_sync")
    try:
        accounts = ExternalAccount.objects.filter(source=LDAP).select_related("user")
        for account in accounts:
            user = account.user
            failed.clear()
            found = backend.populate_user(user.get_username())
            result.checked += 1
            if failed:  # the directory, not the person: nothing is changed
                result.errors.append(f"{user.get_username()}: {failed[0]}")
                if len(result.errors) >= 3 and not result.deactivated:
                    break  # unreachable: the next sync tries again
                continue
            if found is None and user.is_active:
                _directory_disabled(account)
                result.deactivated.append(user.get_username())
    finally:
        ldap_error.disconnect(dispatch_uid="directory_sync")
    if result.errors:
        logger.warning("directory sync: %d errors, first: %s", len(result.errors), result.errors[0])
    return result


@transaction.atomic
def _directory_disabled(account: ExternalAccount) -> None:
    """The directory no longer has this person: the account is deactivated (sessions, tokens
    and Label Studio access end) and loses its mapped teams."""
    user = get_user_model().objects.select_for_update(no_key=True).get(pk=account.user_id)
    memberships_apply(user, set(), team_map(), by=ACTOR)
    user_set_active(actor=None, user=user, active=False, by=ACTOR)
    account.disabled_by_directory = True
    account.save(update_fields=["disabled_by_directory"])
