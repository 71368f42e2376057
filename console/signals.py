from django.contrib.auth import signals
from django.dispatch import receiver

from console.services import audit_record


@receiver(signals.user_logged_in)
def _logged_in(sender, request, user, **kwargs) -> None:
    audit_record(action="login", actor=user)


@receiver(signals.user_logged_out)
def _logged_out(sender, request, user, **kwargs) -> None:
    if user is not None:
        audit_record(action="logout", actor=user)


@receiver(signals.user_login_failed)
def _login_failed(sender, credentials, request=None, **kwargs) -> None:
    audit_record(
        action="login.failed", actor=None, actor_username=str(credentials.get("username", ""))
    )
