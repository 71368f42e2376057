"""Every write of the console app: one function per use case, each recording its audit event."""

import ipaddress
import logging
from datetime import datetime, timedelta
from typing import Any, Literal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Model
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from console import hardware
from console.hardware import NodeDevice
from console.later import later, shown
from console.middleware import client_ip
from console.models import ApiToken, AuditEvent, Device, ExternalAccount, Membership, Node, Team
from console.roles import Role
from console.slugs import ascii_slug
from console.usage import devices_free

User = get_user_model()


def audit_record(
    *,
    action: str,
    actor: AbstractBaseUser | None,
    team: Team | None = None,
    target: Model | None = None,
    data: dict[str, Any] | None = None,
    actor_username: str = "",
) -> AuditEvent:
    return AuditEvent.objects.create(
        team=team,
        actor=actor if actor is not None and actor.pk else None,
        actor_username=actor.get_username() if actor is not None else actor_username,
        action=action,
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:200] if target is not None else "",
        ip_address=client_ip.get(),
        data=data or {},
    )


def _unique_slug(name: str) -> str:
    base = ascii_slug(name)[:50].strip("-") or "team"
    slug, n = base, 1
    while Team.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


def team_create_allowed(user: AbstractBaseUser) -> bool:
    """PLATFORM_TEAM_CREATION: site staff only ("staff", the default) or any account ("any")."""
    if not user.is_authenticated or not user.is_active:
        return False
    return user.is_staff or settings.PLATFORM_TEAM_CREATION == "any"


@transaction.atomic
def team_create(*, actor: AbstractBaseUser, name: str) -> Team:
    if not team_create_allowed(actor):
        raise PermissionDenied(
            _("Only site administrators create teams here: ask one to create yours or add you.")
        )
    name = name.strip()
    if not name:
        raise ValidationError(_("A team needs a name."))
    team = Team.objects.create(name=name, slug=_unique_slug(name))
    Membership.objects.create(team=team, user=actor, role=Role.OWNER)
    audit_record(action="team.create", actor=actor, team=team, target=team)
    return team


@transaction.atomic
def membership_add(*, actor: AbstractBaseUser, team: Team, username: str, role: str) -> Membership:
    """Invite an existing account into the team by its username, with a role."""
    if role not in Role.values:
        raise ValidationError(_("Unknown role “%(role)s”.") % {"role": role})
    user = User.objects.filter(username=username.strip(), is_active=True).first()
    if user is None:
        raise ValidationError(
            _("No active account has the username “%(username)s”.") % {"username": username}
        )
    if Membership.objects.filter(team=team, user=user).exists():
        raise ValidationError(
            _("%(username)s is already a member of this team.") % {"username": username}
        )
    membership = Membership.objects.create(team=team, user=user, role=role)
    audit_record(
        action="membership.add",
        actor=actor,
        team=team,
        target=membership,
        data={"username": user.get_username(), "role": role},
    )
    return membership


def _lock_team(membership: Membership) -> Membership:
    """Lock the team, so that two owners demoting each other at once cannot both succeed."""
    Team.objects.select_for_update().get(pk=membership.team_id)
    return Membership.objects.select_related("team", "user").get(pk=membership.pk)


def _ensure_an_owner_remains(membership: Membership) -> None:
    others = Membership.objects.filter(team=membership.team, role=Role.OWNER).exclude(
        pk=membership.pk
    )
    if membership.role == Role.OWNER and not others.exists():
        raise ValidationError(_("A team keeps at least one owner."))


def _ensure_not_mapped(membership: Membership) -> None:
    if membership.mapped_from:
        raise ValidationError(
            _(
                "%(username)s is a member through the directory group %(group)s: change it "
                "in the directory."
            )
            % {"username": membership.user.get_username(), "group": membership.mapped_from}
        )


@transaction.atomic
def membership_change_role(
    *, actor: AbstractBaseUser, membership: Membership, role: str
) -> Membership:
    if role not in Role.values:
        raise ValidationError(_("Unknown role “%(role)s”.") % {"role": role})
    membership = _lock_team(membership)
    _ensure_not_mapped(membership)
    old = membership.role
    if role == old:
        return membership
    if role != Role.OWNER:
        _ensure_an_owner_remains(membership)
    membership.role = role
    membership.save(update_fields=["role"])
    audit_record(
        action="membership.role_change",
        actor=actor,
        team=membership.team,
        target=membership,
        data={"username": membership.user.get_username(), "from": old, "to": role},
    )
    return membership


@transaction.atomic
def membership_remove(*, actor: AbstractBaseUser, membership: Membership) -> None:
    membership = _lock_team(membership)
    _ensure_not_mapped(membership)
    _ensure_an_owner_remains(membership)
    audit_record(
        action="membership.remove",
        actor=actor,
        team=membership.team,
        target=membership,
        data={"username": membership.user.get_username(), "role": membership.role},
    )
    user, team = membership.user, membership.team
    membership.delete()
    _access_revoked(user, team)


def _access_revoked(user: AbstractBaseUser, team: Team | None) -> None:
    """Tell other apps (console.signals.user_access_revoked), once committed."""
    from console.signals import user_access_revoked

    transaction.on_commit(lambda: user_access_revoked.send(sender=type(user), user=user, team=team))


# The longest lifetime a key may be given, in days; longer is "never" (explicitly).
KEY_MAX_DAYS = 3650


def key_expiry(days: int | None) -> datetime | None:
    """When a key issued now for ``days`` days expires; None (never) for ``None``."""
    if days is None:
        return None
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= KEY_MAX_DAYS:
        raise ValidationError(
            _("A key expires in 1 to %(max)d days, or never; “%(days)s” is neither.")
            % {"max": KEY_MAX_DAYS, "days": days}
        )
    return timezone.now() + timedelta(days=days)


def api_token_default_days() -> int | None:
    """The lifetime of a token whose creator did not choose one (API_TOKEN_DEFAULT_DAYS)."""
    return settings.API_TOKEN_DEFAULT_DAYS or None


@transaction.atomic
def api_token_create(
    *,
    actor: AbstractBaseUser,
    name: str,
    expires_in_days: int | Literal["default"] | None = "default",
    via_token: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """Create a personal token; returns it with its key, which is never retrievable again.
    ``expires_in_days``: None never expires; "default" is API_TOKEN_DEFAULT_DAYS.
    ``via_token``: the token the request authenticated with; the new one cannot outlive it
    (the default is cut to its expiry; "never" or a later expiry is refused)."""
    name = name.strip()
    if not name:
        raise ValidationError(_("A token needs a name."))
    default = expires_in_days == "default"
    if default:
        expires_in_days = api_token_default_days()
    expires_at = key_expiry(expires_in_days)
    limit = via_token.expires_at if via_token is not None else None
    if limit is not None and (expires_at is None or expires_at > limit):
        if not default:
            raise ValidationError(
                _(
                    "A token cannot create one that outlives it: this request's token expires "
                    "on %(date)s; choose fewer days, or create the token on the Tokens page."
                )
                % {"date": timezone.localtime(limit).isoformat(timespec="minutes")}
            )
        expires_at = limit
    token, key = ApiToken.issue(user=actor, name=name[:100], expires_at=expires_at)
    audit_record(
        action="token.create",
        actor=actor,
        target=token,
        data={"expires_at": expires_at.isoformat() if expires_at else None},
    )
    return token, key


@transaction.atomic
def api_token_revoke(
    *, actor: AbstractBaseUser | None, token: ApiToken, reason: str = ""
) -> ApiToken:
    """Revoke a personal token: its owner, site staff (any user's) or the platform (None)."""
    if token.revoke():
        data = {"reason": reason} if reason else {}
        if actor is None or token.user_id != actor.pk:
            data["user"] = token.user.get_username()
        audit_record(action="token.revoke", actor=actor, target=token, data=data)
    return token


def _tokens_revoke(actor: AbstractBaseUser | None, user: AbstractBaseUser, reason: str) -> int:
    """Revoke every active personal token of ``user`` (endpoint keys belong to endpoints, not
    to users, and stay). Returns how many."""
    tokens = list(ApiToken.objects.filter(user=user, revoked_at__isnull=True))
    for token in tokens:
        api_token_revoke(actor=actor, token=token, reason=reason)
    return len(tokens)


def _sessions_end(user: AbstractBaseUser, keep: str | None = None) -> int:
    """Delete the user's sessions but ``keep`` (a session key). Django already refuses a
    session after a password change (its hash) or once the account is inactive; deleting them
    makes that final. Only database-backed sessions can be found by user."""
    from importlib import import_module

    store = import_module(settings.SESSION_ENGINE).SessionStore
    if not hasattr(store, "get_model_class"):
        return 0
    model = store.get_model_class()
    ended = 0
    live = model.objects.filter(expire_date__gt=timezone.now()).exclude(session_key=keep or "")
    for session in live.iterator():
        if str(session.get_decoded().get("_auth_user_id")) == str(user.pk):
            model.objects.filter(session_key=session.session_key).delete()
            ended += 1
    return ended


@transaction.atomic
def user_create(
    *, actor: AbstractBaseUser | None, username: str, password: str, is_staff: bool = False
) -> AbstractBaseUser:
    """Create an account (site administrators only; air-gapped sites have no self sign-up)."""
    username = username.strip()
    if User.objects.filter(username=username).exists():
        raise ValidationError(_("The username “%(username)s” is taken.") % {"username": username})
    user = User(username=username, is_staff=is_staff, is_superuser=is_staff)
    user.full_clean(exclude=["password"])
    validate_password(password, user)
    user.set_password(password)
    user.save()
    audit_record(action="user.create", actor=actor, target=user, data={"is_staff": is_staff})
    return user


@transaction.atomic
def user_set_password(
    *,
    actor: AbstractBaseUser,
    user: AbstractBaseUser,
    password: str,
    keep_session: str | None = None,
) -> AbstractBaseUser:
    """Set an account's password: its owner changing it, or a site administrator resetting it.
    Its personal API tokens are revoked and its sessions end, but ``keep_session`` (the one
    the owner changed it from: the caller keeps it with update_session_auth_hash)."""
    if ExternalAccount.objects.filter(user=user).exists():
        # A local password would be a second way in that the directory or the single sign-on
        # cannot end.
        raise ValidationError(
            _("The enterprise's identity system keeps this account's password: change it there.")
        )
    validate_password(password, user)
    user.set_password(password)
    user.save(update_fields=["password"])
    action = "password.change" if actor.pk == user.pk else "password.reset"
    revoked = _tokens_revoke(actor, user, reason=action)
    ended = _sessions_end(user, keep=keep_session)
    audit_record(
        action=action, actor=actor, target=user, data={"tokens_revoked": revoked, "sessions": ended}
    )
    return user


@transaction.atomic
def user_set_active(
    *, actor: AbstractBaseUser | None, user: AbstractBaseUser, active: bool, by: str = ""
) -> AbstractBaseUser:
    """Deactivate an account (it can no longer log in, nor use its tokens) or activate it.
    ``actor`` None: the platform itself did, ``by`` says what (the directory's sync)."""
    if actor is not None and user.pk == actor.pk and not active:
        raise ValidationError(_("You cannot deactivate your own account."))
    user.is_active = active
    user.save(update_fields=["is_active"])
    data = {}
    if not active:
        # Ended, not suspended: activating the account again brings none of them back.
        data["tokens_revoked"] = _tokens_revoke(actor, user, reason="user.deactivate")
        data["sessions"] = _sessions_end(user)
        _access_revoked(user, None)
    audit_record(
        action="user.activate" if active else "user.deactivate",
        actor=actor,
        actor_username=by,
        target=user,
        data=data,
    )
    return user


@transaction.atomic
def lockout_clear(*, actor: AbstractBaseUser, username: str = "", address: str = "") -> int:
    """Lift the login lockout of an account (its failures from every address) or of an
    address (every account's failures from it). Returns how many failure records went."""
    from axes.utils import reset

    username, address = username.strip(), address.strip()
    if not username and not address:
        raise ValidationError(_("Name the account or the address to unlock."))
    if address:
        try:
            address = str(ipaddress.ip_address(address))
        except ValueError as exc:
            raise ValidationError(
                _("“%(address)s” is not an IP address.") % {"address": address}
            ) from exc
    cleared = 0
    if username:
        cleared += reset(username=username)
    if address:
        cleared += reset(ip=address)
    audit_record(
        action="login.unlock",
        actor=actor,
        data={"username": username, "address": address, "cleared": cleared},
    )
    return cleared


# -- Nodes and their devices ------------------------------------------------------------------


class DevicesBusy(Exception):
    """The node's devices of that type are held by other jobs now; ``reason`` says so (a
    console.later message: a job stores it, and it is shown in its reader's language)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return shown(self.reason)


@transaction.atomic
def node_register(
    *,
    name: str,
    devices: list[NodeDevice],
    simulated: bool,
    facts: dict | None = None,
    address: str = "",
) -> Node:
    """A train worker starts on ``name``: its devices and queues, as found now; the devices it
    no longer has are forgotten. What its devices hold stays held: the jobs of a worker that
    died free them when they are taken again, or the beat does (never two jobs on a card,
    not even for a second worker started under the same name)."""
    queues = sorted({hardware.profile(d.device_type).queue for d in devices})
    now = timezone.now()
    found = {"queues": queues, "simulated": simulated, "started_at": now, "heartbeat_at": now}
    if address:
        found["address"] = address
    if facts is not None:
        found["facts"] = facts
    node, _created = Node.objects.select_for_update().update_or_create(
        name=name, defaults={**found, "stopped_at": None}
    )
    keep = []
    for d in devices:
        device, _ = Device.objects.update_or_create(
            node=node,
            device_type=d.device_type,
            index=d.index,
            defaults={"name": d.name, "memory": d.memory},
        )
        keep.append(device.pk)
    gone = node.devices.exclude(pk__in=keep)
    devices_free(gone)  # a device that disappears while held: its time so far is recorded
    gone.delete()
    return node


def node_heartbeat(name: str) -> bool:
    """The node's worker is alive; False when the node is not registered (any more). A node
    marked stopped stays so (a beat racing the worker's shutdown)."""
    nodes = Node.objects.filter(name=name)
    return bool(nodes.filter(stopped_at__isnull=True).update(heartbeat_at=timezone.now())) or (
        nodes.exists()
    )


def node_beat(name: str, devices: list[NodeDevice], *, simulated: bool, address: str) -> None:
    """The train worker's heartbeat; a node whose row went away (deleted, a database
    restored) is registered again with the devices the worker has."""
    if not node_heartbeat(name) and devices:
        node_register(name=name, devices=devices, simulated=simulated, address=address)


def node_redetect(name: str, devices: list[NodeDevice], *, address: str) -> list[NodeDevice]:
    """Detect the node's devices again (the heartbeat, every NODE_REDETECT_S): a card that
    failed or came back changes the registry. Returns the devices the node has now. A device
    type that was not there at start needs the worker started again (its queue)."""
    facts = hardware.probe(settings.TRAINING_PYTHON)
    if "error" in facts:
        return devices  # the probe failed: keep what was known
    found = hardware.devices_from_probe(facts, settings.NODE_CPU_SLOTS)
    if {(d.device_type, d.index) for d in found} == {(d.device_type, d.index) for d in devices}:
        return devices
    log = logging.getLogger(__name__)
    log.warning("node %s: devices changed from %s to %s", name, devices, found)
    if {d.device_type for d in found} - {d.device_type for d in devices}:
        log.warning("node %s: a new device type; restart its train worker to serve it", name)
    node_register(name=name, devices=found, simulated=False, facts=facts, address=address)
    return found


def node_stop(name: str) -> None:
    """The train worker of ``name`` shuts down cleanly."""
    Node.objects.filter(name=name).update(stopped_at=timezone.now())


@transaction.atomic
def devices_acquire(
    *,
    node_name: str,
    device_type: str,
    count: int,
    holder: str,
    label: str,
    team: Team,
    user: AbstractBaseUser | None = None,
    nodes: int = 1,
    replaces: str = "",
) -> dict[str, list[Device]]:
    """Hold ``count`` free devices of ``device_type`` on each of ``nodes`` nodes for ``holder``,
    exclusively: on ``node_name`` (the worker that asks) and on other live nodes (a job that
    spans nodes is placed all at once, or waits holding nothing). Nodes are taken in name
    order, so that two placements never wait on each other. Devices held under ``replaces``
    (a prefix: the same job's earlier attempts) are released first. Returns the devices by
    node, the asking node first. Raises DevicesBusy with the reason."""
    if replaces:
        devices_free(Device.objects.filter(holder__startswith=replaces))
    here = Node.objects.filter(name=node_name).first()
    if here is None:
        raise DevicesBusy(
            later(
                gettext_noop(
                    "Node %(node)s is not registered: start train workers with manage.py "
                    "train_worker."
                ),
                node=node_name,
            )
        )
    held = {
        "holder": holder,
        "holder_label": label[:200],
        "holder_team": team,
        "holder_user": user if user is not None and user.pk else None,
        "held_since": timezone.now(),
    }
    candidates = [here]
    if nodes > 1:
        others = (
            Node.objects.filter(devices__device_type=device_type, devices__holder="")
            .exclude(pk=here.pk)
            .annotate(free=Count("devices"))
        )
        candidates += [n for n in others if n.alive and n.free >= count]
    placed: dict[str, list[Device]] = {}
    for node in sorted(candidates, key=lambda n: n.name):
        if node != here and len(placed) - (here.name in placed) >= nodes - 1:
            continue  # enough other nodes already
        try:
            with transaction.atomic():  # a node only partly taken is given back
                placed[node.name] = _take(node, device_type, count, held)
        except DevicesBusy:
            if node == here:
                raise
    if len(placed) < nodes:
        raise DevicesBusy(
            later(
                gettext_noop(
                    "Waiting: the job spans %(nodes)d nodes with %(n)d free %(device)s devices "
                    "each; %(found)d have them now."
                ),
                nodes=nodes,
                n=count,
                device=device_type,
                found=len(placed),
            )
        )
    return {node_name: placed.pop(node_name), **placed}


def _take(node: Node, device_type: str, count: int, held: dict) -> list[Device]:
    devices = list(Device.objects.filter(node=node, device_type=device_type).order_by("index"))
    free = [d for d in devices if not d.holder]
    if len(free) < count:
        raise DevicesBusy(
            later(
                gettext_noop(
                    "Waiting: %(free)d of %(total)d %(device)s devices of node %(node)s are "
                    "free, the job needs %(n)d."
                ),
                free=len(free),
                total=len(devices),
                device=device_type,
                node=node.name,
                n=count,
            )
        )
    taken = []
    for d in free:
        # Taken only if still free: a compare-and-set, on every database (row locks are no-ops
        # on SQLite). A DevicesBusy later rolls the whole placement back.
        if Device.objects.filter(pk=d.pk, holder="").update(**held):
            for name, value in held.items():
                setattr(d, name, value)
            taken.append(d)
            if len(taken) == count:
                return taken
    raise DevicesBusy(
        later(
            gettext_noop("Waiting: the %(device)s devices of node %(node)s were just taken."),
            device=device_type,
            node=node.name,
        )
    )


def devices_release(holder: str) -> int:
    """Whatever ``holder`` holds becomes free; returns how many devices."""
    return devices_free(Device.objects.filter(holder=holder))


def devices_release_all_but(prefix: str, holders: set[str], older_than_s: float = 60) -> int:
    """Free devices held under ``prefix`` by holders not in ``holders`` (those that ended
    without releasing: a worker killed), taken over ``older_than_s`` ago (not one that a
    holder took since ``holders`` was read). Returns how many."""
    before = timezone.now() - timezone.timedelta(seconds=older_than_s)
    stale = Device.objects.filter(holder__startswith=prefix, held_since__lt=before)
    return devices_free(stale.exclude(holder__in=holders))


# The most device-hours a month a quota may name (about 100 devices all month).
MAX_DEVICE_HOURS = 100_000


@transaction.atomic
def team_quotas_set(
    *,
    actor: AbstractBaseUser,
    team: Team,
    max_concurrent_jobs: int | None,
    device_hours_quota: dict[str, float],
    storage_quota_gb: float | None,
    max_endpoints: int | None = None,
    max_replicas: int | None = None,
) -> Team:
    """Site staff set a team's quotas: jobs at once (None: the site's default), device-hours
    a month per device type (a type not named is not limited), storage (None: the site's
    default), endpoints and predictor replicas (None: no limit). Audited with the old and new
    values."""
    from console.hardware import profiles

    if not actor.is_staff:
        raise PermissionDenied
    known = set(profiles())
    for device, hours in device_hours_quota.items():
        if device not in known:
            raise ValidationError(
                _("Unknown device type “%(device)s”; known: %(known)s.")
                % {"device": device, "known": ", ".join(sorted(known))}
            )
        if not 0 <= float(hours) <= MAX_DEVICE_HOURS:
            raise ValidationError(
                _("Device-hours a month are between 0 and %(max)d, not %(hours)s.")
                % {"max": MAX_DEVICE_HOURS, "hours": hours}
            )
    if max_concurrent_jobs is not None and not 1 <= max_concurrent_jobs <= 1000:
        raise ValidationError(_("Jobs at once are between 1 and 1000."))
    if storage_quota_gb is not None and not 0 <= storage_quota_gb <= 10**7:
        raise ValidationError(_("The storage quota is between 0 and 10,000,000 GB."))
    for limit in (max_endpoints, max_replicas):
        if limit is not None and not 0 <= limit <= 10_000:
            raise ValidationError(_("Endpoint and replica quotas are between 0 and 10,000."))
    team = Team.objects.select_for_update().get(pk=team.pk)
    old = {
        "max_concurrent_jobs": team.max_concurrent_jobs,
        "device_hours_quota": team.device_hours_quota,
        "storage_quota_gb": team.storage_quota_gb,
        "max_endpoints": team.max_endpoints,
        "max_replicas": team.max_replicas,
    }
    team.max_endpoints, team.max_replicas = max_endpoints, max_replicas
    team.max_concurrent_jobs = max_concurrent_jobs
    team.device_hours_quota = {k: float(v) for k, v in sorted(device_hours_quota.items())}
    team.storage_quota_gb = storage_quota_gb
    team.save(update_fields=list(old))
    new = {k: getattr(team, k) for k in old}
    audit_record(
        action="team.quotas", actor=actor, team=team, target=team, data={"from": old, "to": new}
    )
    return team
