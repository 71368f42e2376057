from celery import shared_task

from console import health


@shared_task
def beat_heartbeat() -> None:
    """Scheduled by beat: its freshness on the dashboard shows that beat and a worker run."""
    health.record_beat()
