from celery import shared_task

from labeling import services


@shared_task
def run_import_job(job_id: int) -> None:
    """Import a file (or merge versions) into a new dataset version.

    Acknowledged late: a worker killed mid-import leaves the task queued, and the next worker
    runs the import again from the start (it writes nothing visible until it is done)."""
    services.import_run(job_id)
