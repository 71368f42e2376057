"""Label Studio follows the console: the console (which imports no other app) sends Django's
own signals, and labeling listens.

- A membership made, changed or deleted, a user saved deactivated, or the console's
  ``user_access_revoked``: the user's Label Studio account is brought in line after the commit
  (a Celery task; the reconciliation every minute is the guarantee).
- A console logout: the user's Label Studio sessions end at once (the session the console handed
  over lives in the same browser), and its API tokens go with them.
- A password changed (Django sends no signal of its own: the saved hash is compared): the same,
  after the commit. The Label Studio account's password is the platform's own, derived, so it
  does not change with the user's: its sessions and tokens would outlive the change.
"""

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver

from console.models import Membership
from console.signals import user_access_revoked
from labeling.models import LabelStudioAccount

logger = logging.getLogger(__name__)


def _queue_update(user_id: int) -> None:
    if (
        not settings.LABEL_STUDIO_URL
        or not LabelStudioAccount.objects.filter(user_id=user_id).exists()
    ):
        return

    def send() -> None:
        from labeling.tasks import update_label_studio_account

        try:
            update_label_studio_account.delay(user_id)
        except Exception:  # the broker away: the reconciliation does it
            logger.warning("Label Studio account of user %s not queued for update", user_id)

    transaction.on_commit(send)


@receiver(post_save, sender=Membership, dispatch_uid="labeling.membership_saved")
@receiver(post_delete, sender=Membership, dispatch_uid="labeling.membership_deleted")
def _membership_changed(sender, instance: Membership, **kwargs) -> None:
    _queue_update(instance.user_id)


@receiver(post_save, sender=get_user_model(), dispatch_uid="labeling.user_saved")
def _user_saved(sender, instance, created: bool, update_fields=None, **kwargs) -> None:
    if not created and not instance.is_active:
        _queue_update(instance.pk)


@receiver(pre_save, sender=get_user_model(), dispatch_uid="labeling.user_password_check")
def _password_check(sender, instance, update_fields=None, **kwargs) -> None:
    if instance.pk is None or (update_fields is not None and "password" not in update_fields):
        return
    before = sender.objects.filter(pk=instance.pk).values_list("password", flat=True).first()
    instance._label_studio_password_changed = before is not None and before != instance.password


@receiver(post_save, sender=get_user_model(), dispatch_uid="labeling.user_password_changed")
def _password_changed(sender, instance, created: bool, **kwargs) -> None:
    if not getattr(instance, "_label_studio_password_changed", False):
        return
    instance._label_studio_password_changed = False
    if (
        not settings.LABEL_STUDIO_URL
        or not LabelStudioAccount.objects.filter(user_id=instance.pk).exists()
    ):
        return

    def end() -> None:
        from labeling.label_studio import sessions_end

        try:
            sessions_end(instance)
        except Exception:  # never stand in the way of a password change: logged, and loud
            logger.exception("Label Studio sessions and tokens of %s not ended", instance)

    transaction.on_commit(end)


@receiver(user_access_revoked, dispatch_uid="labeling.access_revoked")
def _access_revoked(sender, user, team=None, **kwargs) -> None:
    """The console's own word (sent after the commit) that a user was deactivated or removed
    from a team: the same update, in case the change bypassed the models' signals."""
    _queue_update(user.pk)


@receiver(user_logged_out, dispatch_uid="labeling.logged_out")
def _logged_out(sender, request, user, **kwargs) -> None:
    if user is None or not settings.LABEL_STUDIO_URL:
        return
    from labeling.label_studio import sessions_end

    try:
        sessions_end(user)
    except Exception:  # never stand in the way of a logout
        logger.exception("Label Studio sessions of %s not ended", user)
