from axes.signals import user_locked_out
from django.contrib.auth import signals
from django.dispatch import Signal, receiver
from django.utils import timezone

from console.services import audit_record

# Sent when an account loses access: deactivated (``team`` None) or removed from ``team``.
# Arguments: ``sender`` (the user model), ``user``, ``team`` (a Team or None). Sent once the
# change is committed, so receivers (another app ending the account's access elsewhere, e.g.
# Label Studio) see it; console imports none of them.
user_access_revoked = Signal()


@receiver(signals.user_logged_in)
def _logged_in(sender, request, user, **kwargs) -> None:
    audit_record(action="login", actor=user)


@receiver(signals.user_logged_out)
def _logged_out(sender, request, user, **kwargs) -> None:
    if user is not None:
        audit_record(action="logout", actor=user)


@receiver(signals.user_login_failed)
def _login_failed(sender, credentials, request=None, **kwargs) -> None:
    if credentials.get("kind") == "token":
        return  # unknown API tokens: counted by the lockout, recorded when it locks
    audit_record(
        action="login.failed", actor=None, actor_username=str(credentials.get("username", ""))
    )


@receiver(user_locked_out)
def _locked_out(sender, request, username, ip_address, **kwargs) -> None:
    # Sent for each refused try too; recorded once, by the failure that locked (the one that
    # was counted).
    if getattr(request, "axes_failures_since_start", None) is None:
        return
    from console.lockout import retry_at

    credentials = getattr(request, "axes_credentials", None) or {"username": username}
    until = retry_at(request, credentials)
    audit_record(
        action="login.locked",
        actor=None,
        actor_username=username or "",
        data={
            "address": ip_address,
            "by": "token" if credentials.get("kind") == "token" else "password",
            "failures": request.axes_failures_since_start,
            "until": timezone.localtime(until).isoformat(timespec="seconds") if until else None,
        },
    )
