import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from console.roles import Role


class Team(models.Model):
    """The tenant: every object of the platform belongs to one team."""

    name = models.CharField(_("name"), max_length=100)
    slug = models.SlugField(_("slug"), max_length=60, unique=True)
    # The team's own storage quota in GB, set by site staff; empty: TEAM_STORAGE_QUOTA_GB.
    storage_quota_gb = models.FloatField(_("storage quota (GB)"), null=True, blank=True)
    # Set by site staff (console/usage.py): jobs running at once (empty:
    # TRAINING_TEAM_CONCURRENCY) and device-hours a calendar month per device type
    # ({"gpu": 100}; a type not named is not limited).
    max_concurrent_jobs = models.PositiveSmallIntegerField(_("jobs at once"), null=True, blank=True)
    device_hours_quota = models.JSONField(_("device-hours a month"), default=dict, blank=True)
    # Endpoints, and predictor replicas of their active revisions (empty: no limit).
    max_endpoints = models.PositiveSmallIntegerField(_("endpoints"), null=True, blank=True)
    max_replicas = models.PositiveSmallIntegerField(_("replicas"), null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Created(models.Model):
    """Who created an object (empty once their account is deleted) and when: the teams'
    objects have both. (Each keeps its own ``team`` key: an abstract key's related_name
    "%(class)ss" would deconstruct as such and alter every model's field in a migration.)"""

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(_("role"), max_length=20, choices=Role.choices)
    # The group this membership is mapped from (a directory group's DN, console/directory.py,
    # or a single sign-on group, console/oidc.py): the identity system keeps it, the console
    # cannot change it. Empty: made in the console.
    mapped_from = models.CharField(max_length=1000, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    # The member's notifications of this team up to this moment are read (the bell's count).
    notifications_seen_at = models.DateTimeField(default=timezone.now)
    # When the member last came to the team's pages (moved there from another team or a new
    # login): the console opens there after the next login.
    last_visited_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["team__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.team} ({self.role})"


class ExternalAccount(models.Model):
    """An account that the enterprise's identity system provides: its directory (LDAP,
    console/directory.py) or its single sign-on (OpenID Connect, console/oidc.py). Such an
    account has no password here; it is found by its ``subject`` (the directory entry's DN,
    or the provider's issuer and subject), never by its name."""

    class Source(models.TextChoices):
        LDAP = "ldap", _("directory")
        OIDC = "oidc", _("single sign-on")

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_account"
    )
    source = models.CharField(max_length=10, choices=Source.choices)
    subject = models.CharField(max_length=1000)
    display_name = models.CharField(_("display name"), max_length=150, blank=True, default="")
    synced_at = models.DateTimeField(default=timezone.now)
    # Deactivated because the directory no longer has the person (disabled or removed): a
    # later sync or login that finds them again activates the account again. An account that
    # site staff deactivated stays so.
    disabled_by_directory = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "subject"], name="one_account_per_subject")
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.subject}"


TOKEN_PREFIX = "mp_"  # noqa: S105 - a marker, not a secret


def hash_token(key: str) -> str:
    # Keys are 256-bit random values, so a fast unsalted hash is safe and allows indexed lookup.
    return hashlib.sha256(key.encode()).hexdigest()


class HashedKey(models.Model):
    """A secret key of which only the hash is stored; the key is shown once, at creation.
    Personal API tokens and endpoint API keys are both."""

    KEY_PREFIX = TOKEN_PREFIX

    name = models.CharField(_("name"), max_length=100)
    # The first characters of the key, kept so a user can tell keys apart.
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Empty: the key never expires.
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and not self.is_expired

    @property
    def status(self) -> str:
        """``active``, ``revoked`` or ``expired`` (a revoked key stays revoked once expired)."""
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.is_expired else "active"

    def revoke(self) -> bool:
        """Revoke the key; False when it already was."""
        if self.revoked_at is not None:
            return False
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])
        return True

    @classmethod
    def issue(cls, **fields) -> tuple["HashedKey", str]:
        """A new key: the saved object and the key itself (never retrievable again)."""
        key = cls.KEY_PREFIX + secrets.token_urlsafe(32)
        obj = cls.objects.create(prefix=key[:10], key_hash=hash_token(key), **fields)
        return obj, key


class ApiToken(HashedKey):
    """A personal API token."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta(HashedKey.Meta):
        pass


class AuditEvent(models.Model):
    """Who did what to which object in which team, when, from which address.

    Written only by services (``console.services.audit_record``). ``team`` is empty for events
    that belong to a user rather than a team (login, personal API tokens).
    """

    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, related_name="audit_events"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # Kept apart from ``actor`` so the log still names a user after the account is deleted.
    actor_username = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_repr = models.CharField(max_length=200, blank=True)
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_username} {self.action}"


class Node(models.Model):
    """A machine that runs a train worker: registered with its devices when the worker starts,
    kept alive by its heartbeat. Infrastructure of the whole installation, not of one team."""

    name = models.CharField(_("name"), max_length=200, unique=True)
    queues = models.JSONField(default=list)
    # Where other nodes reach it (a job spanning nodes meets at its first node's address).
    address = models.CharField(max_length=200, blank=True)
    # Devices declared by PLATFORM_DEVICES, not detected: its jobs run on the CPU underneath.
    simulated = models.BooleanField(default=False)
    # What the hardware probe reported (framework versions and builds), or its error.
    facts = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        """The queue of this node alone: the parts of jobs that span several nodes."""
        return f"node.{self.name}"

    @property
    def alive(self) -> bool:
        age = (timezone.now() - self.heartbeat_at).total_seconds()
        return self.stopped_at is None and age < settings.NODE_STALE_S


class Device(models.Model):
    """One device of a node, held by at most one job at a time (``holder``): two jobs never
    share a card. The holder is named by key (``training_job:42``) so that this app knows
    nothing of the apps that hold devices."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    device_type = models.CharField(max_length=20)
    index = models.PositiveIntegerField()
    name = models.CharField(max_length=200, blank=True)
    memory = models.BigIntegerField(null=True, blank=True)
    holder = models.CharField(max_length=100, blank=True, db_index=True)
    holder_label = models.CharField(max_length=200, blank=True)
    holder_team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    held_since = models.DateTimeField(null=True, blank=True)
    # Who started what holds it (a job's creator): usage is accounted to them too.
    # No database constraint: a claim (which holds its team's row) writing it must not wait on
    # the user's row, which a submission holds while it inserts a job of the team (deadlock).
    holder_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
    )

    class Meta:
        ordering = ["node__name", "device_type", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "device_type", "index"], name="device_unique_per_node"
            )
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.device_type}:{self.index}"


class DeviceUse(models.Model):
    """Device time one holder used, recorded when it let its devices go (console/usage.py):
    what usage accounting and the device-hour quotas add up."""

    # No database constraints: a record written where devices are let go must take no lock on
    # the team's or the user's row (their deletion is Django's SET_NULL all the same).
    team = models.ForeignKey(
        Team, null=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False
    )
    team_name = models.CharField(max_length=100)  # kept for chargeback after a team is gone
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
    )
    username = models.CharField(max_length=150, blank=True)
    holder = models.CharField(max_length=100, db_index=True)  # e.g. training_job:42:1
    label = models.CharField(max_length=200, blank=True)  # e.g. "#42 reviews"
    device_type = models.CharField(max_length=20)
    devices = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-ended_at"]

    def __str__(self) -> str:
        return f"{self.label} {self.devices}×{self.device_type}"

    @property
    def device_hours(self) -> float:
        return self.devices * (self.ended_at - self.started_at).total_seconds() / 3600


class NotificationChannel(Created):
    """Where a team is told what happened (console/notifications.py): an email list, or a
    group robot of DingTalk, WeCom or Feishu, each with the events it wants. A robot's webhook
    address and signing secret are kept sealed (encrypted with a key from SECRET_KEY): the
    platform must present them, so they cannot be hashed."""

    class Kind(models.TextChoices):
        EMAIL = "email", _("Email")
        DINGTALK = "dingtalk", _("DingTalk robot")
        WECOM = "wecom", _("WeCom robot")
        FEISHU = "feishu", _("Feishu robot")

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="notification_channels")
    name = models.CharField(_("name"), max_length=100)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    # Email: the addresses, comma-separated; a robot: its webhook address, sealed.
    target = models.TextField()
    secret = models.TextField(blank=True)  # a robot's signing secret, sealed
    events = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Notification(models.Model):
    """One thing a team is told: shown under the console's bell to its members, and sent to
    its channels that want its event (a ``NotificationDelivery`` each)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=32)
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    link = models.CharField(max_length=500, blank=True)  # a path of the console
    # What the event is about ("job:42"): one notification per event and subject at most.
    subject = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "event", "subject"],
                condition=~models.Q(subject=""),
                name="one_notification_per_event_and_subject",
            )
        ]

    def __str__(self) -> str:
        return self.title


class NotificationDelivery(models.Model):
    """A notification sent to one channel, by a Celery task with retries; a failure is shown
    on the team's notifications page, never raised into what caused it."""

    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        SENT = "sent", _("sent")
        FAILED = "failed", _("failed")

    notification = models.ForeignKey(
        Notification, on_delete=models.CASCADE, related_name="deliveries"
    )
    channel = models.ForeignKey(
        NotificationChannel, on_delete=models.CASCADE, related_name="deliveries"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    error = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.notification} → {self.channel}"
