"""Notifications: what a team is told (``EVENTS``, the one list), and where.

An app says what happened with ``notify()``: a ``Notification`` shown under the console's bell
to the team's members, and a ``NotificationDelivery`` for each of the team's channels that wants
the event, sent by a Celery task with retries (``console.tasks.deliver_notification``). Channels
are chosen by the team's owners: email (Django's SMTP settings) and the group robots Chinese
teams use, each with its own way of proving the sender: DingTalk (a signature of the timestamp
in the URL), WeCom (the key in the webhook address), Feishu (a signature in the body). A failed
delivery is kept with its reason on the team's notifications page; nothing here ever raises
into the job, import or sync that caused it.

Robots are reached only at the hosts of ``NOTIFY_ROBOT_HOSTS`` (their public addresses by
default, or the site's relay): a team's owner cannot make the platform call its internal
services. A robot's address and secret are sealed (Fernet, a key derived from SECRET_KEY).
"""

import base64
import hashlib
import hmac
import logging
import time
from urllib.parse import quote, urlsplit

import requests
from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from console.models import (
    Membership,
    Notification,
    NotificationChannel,
    NotificationDelivery,
    Team,
)

logger = logging.getLogger(__name__)

# What a team can be told about; the apps name these in notify().
EVENTS = {
    "job_succeeded": gettext_lazy("A training job succeeded"),
    "job_failed": gettext_lazy("A training job failed"),
    "import_failed": gettext_lazy("An import failed"),
    "labeling_finished": gettext_lazy("A labeling project is finished"),
    "endpoint_unhealthy": gettext_lazy("An endpoint is unhealthy"),
    "quota_nearly_used": gettext_lazy("A quota is nearly used"),
}
# A device-hour quota is "nearly used" at this share.
QUOTA_WARNING_SHARE = 0.8
ROBOT_TIMEOUT_S = 10


class DeliveryFailed(Exception):
    pass


def notify(
    team: Team, event: str, title: str, *, body: str = "", link: str = "", subject: str = ""
) -> Notification | None:
    """Tell ``team`` that ``event`` happened (``subject``: what it is about, told once). The
    deliveries go out once the caller's transaction commits. Never raises: a notification
    that cannot be made is logged, and what caused it goes on."""
    if event not in EVENTS:
        raise ValueError(f"unknown notification event {event!r}")
    try:
        with transaction.atomic():
            notification = Notification.objects.create(
                team=team,
                event=event,
                title=title[:200],
                body=body[:4000],
                link=link[:500],
                subject=subject[:100],
            )
            deliveries = [
                NotificationDelivery.objects.create(notification=notification, channel=channel)
                for channel in team.notification_channels.filter(enabled=True)
                if event in channel.events
            ]
    except IntegrityError:
        return None  # told already
    except Exception:
        logger.exception("notification %s of team %s not made", event, team.pk)
        return None
    from console.tasks import deliver_notification

    for delivery in deliveries:
        transaction.on_commit(lambda pk=delivery.pk: deliver_notification.delay(pk))
    return notification


def unread_count(membership: Membership) -> int:
    return Notification.objects.filter(
        team=membership.team_id, created_at__gt=membership.notifications_seen_at
    ).count()


# -- Channels ---------------------------------------------------------------------------------


def _fernet() -> Fernet:
    key = hashlib.sha256(b"notification channels:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def seal(text: str) -> str:
    return _fernet().encrypt(text.encode()).decode() if text else ""


def unseal(token: str) -> str:
    if not token:
        return ""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise DeliveryFailed(
            _("The channel's address cannot be read (SECRET_KEY changed?): enter it again.")
        ) from None


def robot_url_check(url: str) -> str:
    """``url`` if it is a robot's webhook at an allowed host, else ValidationError."""
    parts = urlsplit(url)
    allowed = [h.lower() for h in settings.NOTIFY_ROBOT_HOSTS]
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValidationError(_("Enter the robot's webhook address (https://…)."))
    host = parts.hostname.lower() + (f":{parts.port}" if parts.port else "")
    if host not in allowed and parts.hostname.lower() not in allowed:
        raise ValidationError(
            _("Robots are reached only at %(hosts)s (NOTIFY_ROBOT_HOSTS); ask site staff.")
            % {"hosts": ", ".join(allowed) or "—"}
        )
    return url


def email_addresses(text: str) -> list[str]:
    from django.core.validators import validate_email

    addresses = [a.strip() for a in text.replace(";", ",").split(",") if a.strip()]
    if not addresses:
        raise ValidationError(_("Enter at least one email address."))
    if len(addresses) > 50:
        raise ValidationError(_("At most 50 addresses."))
    for address in addresses:
        validate_email(address)
    return addresses


def _text(notification: Notification) -> str:
    lines = [notification.title]
    if notification.body:
        lines.append(notification.body)
    if notification.link:
        lines.append(settings.PLATFORM_URL.rstrip("/") + notification.link)
    return "\n\n".join(lines)


def _signature(key: bytes, message: bytes) -> str:
    return base64.b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode()


def _post(url: str, body: dict, ok: tuple[str, ...]) -> None:
    """POST ``body`` to a robot; its answer must say success (one of ``ok`` keys is 0)."""
    try:
        answer = requests.post(url, json=body, timeout=ROBOT_TIMEOUT_S, allow_redirects=False)
    except requests.RequestException as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc
    if answer.status_code != 200:
        raise DeliveryFailed(f"HTTP {answer.status_code}: {answer.text[:300]}")
    try:
        result = answer.json()
    except ValueError:
        raise DeliveryFailed(f"not JSON: {answer.text[:300]}") from None
    codes = [result.get(k) for k in ok if k in result]
    if not codes or any(c != 0 for c in codes):
        raise DeliveryFailed(str(result)[:300])


def send_dingtalk(channel: NotificationChannel, notification: Notification) -> None:
    url, secret = robot_url_check(unseal(channel.target)), unseal(channel.secret)
    if secret:  # 加签: timestamp (ms) and the HMAC-SHA256 of "timestamp\nsecret"
        stamp = str(int(time.time() * 1000))
        sign = _signature(secret.encode(), f"{stamp}\n{secret}".encode())
        url += f"{'&' if '?' in url else '?'}timestamp={stamp}&sign={quote(sign, safe='')}"
    text = _text(notification)
    body = {"msgtype": "markdown", "markdown": {"title": notification.title, "text": text}}
    _post(url, body, ("errcode",))


def send_wecom(channel: NotificationChannel, notification: Notification) -> None:
    # A WeCom group robot is proved by the key in its address; it has no signature.
    url = robot_url_check(unseal(channel.target))
    _post(url, {"msgtype": "markdown", "markdown": {"content": _text(notification)}}, ("errcode",))


def send_feishu(channel: NotificationChannel, notification: Notification) -> None:
    url, secret = robot_url_check(unseal(channel.target)), unseal(channel.secret)
    body: dict = {"msg_type": "text", "content": {"text": _text(notification)}}
    if secret:  # 签名校验: seconds, the HMAC-SHA256 keyed by "timestamp\nsecret" of nothing
        stamp = str(int(time.time()))
        body.update(timestamp=stamp, sign=_signature(f"{stamp}\n{secret}".encode(), b""))
    _post(url, body, ("code", "StatusCode"))


def send_email(channel: NotificationChannel, notification: Notification) -> None:
    try:
        send_mail(
            subject=f"[{settings.PLATFORM_NAME}] {notification.title}",
            message=_text(notification),
            from_email=settings.DEFAULT_FROM_EMAIL,
            recipient_list=email_addresses(channel.target),
        )
    except (OSError, ValidationError) as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc


SENDERS = {
    NotificationChannel.Kind.EMAIL: send_email,
    NotificationChannel.Kind.DINGTALK: send_dingtalk,
    NotificationChannel.Kind.WECOM: send_wecom,
    NotificationChannel.Kind.FEISHU: send_feishu,
}


def deliver(delivery_id: int, *, final: bool) -> None:
    """Send one delivery. A failure is recorded with its reason; raised (DeliveryFailed) to be
    tried again unless ``final``, when the delivery is marked failed."""
    delivery = (
        NotificationDelivery.objects.select_related("channel", "notification")
        .filter(pk=delivery_id)
        .first()
    )
    if delivery is None or delivery.status == NotificationDelivery.Status.SENT:
        return
    delivery.attempts += 1
    try:
        try:
            SENDERS[delivery.channel.kind](delivery.channel, delivery.notification)
        except ValidationError as exc:  # an address no longer allowed
            raise DeliveryFailed(" ".join(exc.messages)) from exc
    except DeliveryFailed as exc:
        delivery.error = str(exc)[:2000]
        if final:
            delivery.status = NotificationDelivery.Status.FAILED
        delivery.save(update_fields=["attempts", "error", "status"])
        if not final:
            raise
        return
    delivery.status, delivery.error, delivery.sent_at = (
        NotificationDelivery.Status.SENT,
        "",
        timezone.now(),
    )
    delivery.save(update_fields=["attempts", "error", "status", "sent_at"])


# -- A team's channels, as its owners set them ------------------------------------------------


def channel_create(
    *,
    actor,
    team: Team,
    name: str,
    kind: str,
    target: str,
    secret: str,
    events: list[str],
) -> NotificationChannel:
    """A new channel of ``team`` (its owners; the view checks the role). The address is checked
    (emails, or a robot at an allowed host) and a robot's address and secret are sealed.
    Audited without them."""
    from console.services import audit_record

    if kind not in NotificationChannel.Kind.values:
        raise ValidationError(_("Choose one of the kinds."))
    if unknown := set(events) - set(EVENTS):
        raise ValidationError(_("Unknown events: %(e)s") % {"e": ", ".join(sorted(unknown))})
    if team.notification_channels.count() >= 20:
        raise ValidationError(_("A team has at most 20 channels."))
    target = target.strip()
    if kind == NotificationChannel.Kind.EMAIL:
        target = ", ".join(email_addresses(target))
        secret = ""
    else:
        target = seal(robot_url_check(target))
        secret = seal(secret.strip())
    channel = NotificationChannel.objects.create(
        team=team,
        name=name.strip()[:100],
        kind=kind,
        target=target,
        secret=secret,
        events=sorted(set(events)),
        created_by=actor,
    )
    audit_record(
        action="notification.channel_create",
        actor=actor,
        team=team,
        target=channel,
        data={"kind": kind, "events": channel.events},
    )
    return channel


def channel_delete(*, actor, channel: NotificationChannel) -> None:
    from console.services import audit_record

    audit_record(
        action="notification.channel_delete",
        actor=actor,
        team=channel.team,
        target=channel,
        data={"kind": channel.kind},
    )
    channel.delete()


def channel_display(channel: NotificationChannel) -> str:
    """What the page shows of a channel's address: emails, or a robot's host only (its token
    stays sealed)."""
    if channel.kind == NotificationChannel.Kind.EMAIL:
        return channel.target
    try:
        return urlsplit(unseal(channel.target)).netloc
    except DeliveryFailed as exc:
        return str(exc)
