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
