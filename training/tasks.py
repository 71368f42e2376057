from celery import shared_task
from django.db import DatabaseError

from training import scheduling, supervision, sweeps


# No result is stored: a job that waited is sent again under the same task id, and Celery does
# not give back a lost worker's task whose id already has a SUCCESS stored (it would take it for
# a task that succeeded before the worker died).
@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    autoretry_for=(DatabaseError,),
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=30,
)
def run_training_job(self, job_id: int) -> None:
    """Run a training job on this train worker (queue ``train.<device>``).

    Acknowledged late and rejected when the worker is lost: a worker killed mid-job puts the
    job back on its queue, and the next attempt resumes from the last checkpoint. A team at its
    concurrency limit, or a node whose devices are held by other jobs, waits: the task comes
    back in a few seconds. The job holds its devices until its task ends. The database
    unreachable (or locked) mid-way: the runner is stopped and the task retried with backoff;
    the job resumes from its checkpoint."""
    try:
        job = scheduling.training_job_claim(job_id, self.request.hostname or "")
    except scheduling.JobMustWait:
        # Sent again in a few seconds, on its device type's queue (another node may take it);
        # not a retry, which would count against the database errors' retries.
        scheduling.training_job_wait(job_id)
        return
    if job is not None:
        try:
            supervision.training_job_execute(job)
        finally:
            scheduling.training_job_release_devices(job)


@shared_task(acks_late=True, reject_on_worker_lost=False, ignore_result=True)
def run_training_job_part(job_id: int, part: int, attempt: int) -> None:
    """One node's part of a job that spans nodes (queue ``node.<name>`` of that node). Not
    given back when its worker dies: the job's first node sees its processes fail, and the
    job's next attempt starts every part anew."""
    supervision.training_job_part_execute(job_id, part, attempt)


@shared_task
def reconcile_training_jobs() -> None:
    """Scheduled by beat: queue again the running jobs whose worker stopped beating."""
    scheduling.training_jobs_reconcile()
    sweeps.sweeps_reconcile()


@shared_task(
    acks_late=True,
    autoretry_for=(DatabaseError,),
    retry_backoff=2,
    max_retries=10,
    ignore_result=True,
)
def advance_sweep(sweep_id: int) -> None:
    """A trial of the sweep ended (queue ``default``): queue the next, or end the search."""
    sweeps.sweep_advance(sweep_id)
