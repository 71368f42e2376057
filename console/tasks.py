from celery import shared_task

from console import health


@shared_task
def beat_heartbeat() -> None:
    """Scheduled by beat: its freshness on the dashboard shows that beat and a worker run."""
    health.record_beat()


@shared_task
def directory_sync() -> dict:
    """Scheduled by beat every LDAP_SYNC_MINUTES where a directory is configured: the accounts
    it provides read again (console/directory.py)."""
    from console.directory import directory_sync as sync

    result = sync()
    return {"checked": result.checked, "deactivated": result.deactivated, "errors": result.errors}


@shared_task(bind=True, acks_late=True, ignore_result=True, max_retries=4)
def deliver_notification(self, delivery_id: int) -> None:
    """Send one notification to one channel (console/notifications.py); a failure is tried
    again after NOTIFY_RETRY_S seconds, doubling, and kept failed with its reason after the
    last try."""
    from django.conf import settings

    from console.notifications import DeliveryFailed, deliver

    try:
        deliver(delivery_id, final=self.request.retries >= self.max_retries)
    except DeliveryFailed as exc:
        raise self.retry(countdown=settings.NOTIFY_RETRY_S * 2**self.request.retries) from exc


@shared_task(ignore_result=True)
def nightly_backup() -> str:
    """Scheduled by beat at BACKUP_HOUR where BACKUP_DIR is set: one archive, the newest
    BACKUP_KEEP kept (console/backup.py)."""
    from pathlib import Path

    from django.conf import settings

    from console.backup import backup_create, backups_prune

    archive = backup_create(Path(settings.BACKUP_DIR))
    backups_prune(Path(settings.BACKUP_DIR), settings.BACKUP_KEEP)
    return str(archive)
