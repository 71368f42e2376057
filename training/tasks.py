from celery import shared_task

from training import services


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True)
def run_training_job(self, job_id: int) -> None:
    """Run a training job on this train worker (queue ``train.<device>``).

    Acknowledged late and rejected when the worker is lost: a worker killed mid-job puts the
    job back on its queue, and the next attempt resumes from the last checkpoint. A team at its
    concurrency limit waits: the task comes back in a few seconds."""
    try:
        job = services.training_job_claim(job_id, self.request.hostname or "")
    except services.TeamLimitReached:
        raise self.retry(
            countdown=5,
            max_retries=None,
            queue=self.request.delivery_info.get("routing_key"),
            priority=(self.request.delivery_info or {}).get("priority"),
        ) from None
    if job is not None:
        services.training_job_execute(job)


@shared_task
def reconcile_training_jobs() -> None:
    """Scheduled by beat: queue again the running jobs whose worker stopped beating."""
    services.training_jobs_reconcile()
