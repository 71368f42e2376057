"""Which train worker runs a job, and when: the claim (one team's jobs at most
TRAINING_TEAM_CONCURRENCY at once, the devices of the node, or of several, that the job's
placement holds), a job that must wait and comes back, the devices each attempt holds until its
task ends, and beat's reconciliation (a lost worker's job queued again, devices freed, why a
queued job still waits)."""

import os
import uuid

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from console.hardware import placement_plan, profile
from console.later import later
from console.models import Device, Node, Team
from console.selectors import live_nodes_with
from console.services import (
    DevicesBusy,
    devices_acquire,
    devices_release,
    devices_release_all_but,
)
from console.usage import concurrency_limit, device_hours_check, recent_device_hours
from training.jobs import no_node_reason, training_job_enqueue, training_job_finish
from training.models import TrainingJob


class JobMustWait(Exception):
    pass


def training_job_wait(job_id: int, countdown: float = 5) -> None:
    """A job that must wait (its team's limit, devices held by others) comes back later."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is not None and job.is_active:
        training_job_enqueue(job, countdown=countdown)


def training_job_claim(job_id: int, worker: str) -> TrainingJob | None:
    """Take a job for this worker, or say why not: None when it is over (cancelled, done, or
    running elsewhere), JobMustWait when the team runs as many jobs as it may or the node's
    devices are held by other jobs (the job's waiting reason says which)."""
    claimed = _claim(job_id, worker)
    if isinstance(claimed, str):
        raise JobMustWait(claimed)
    return claimed


@transaction.atomic
def _claim(job_id: int, worker: str) -> TrainingJob | str | None:
    job = TrainingJob.objects.select_related("team").filter(pk=job_id).first()
    if job is None:
        return None
    # One claim per team at a time; NO KEY UPDATE: rows that only refer to the team (a job
    # submitted meanwhile) are not held up by it.
    Team.objects.select_for_update(no_key=True).get(pk=job.team_id)
    job = TrainingJob.objects.select_for_update().get(pk=job_id)
    if not job.is_active:
        return None
    if job.cancel_requested:
        training_job_finish(job, TrainingJob.Status.CANCELLED)
        return None
    now = timezone.now()
    if job.status == TrainingJob.Status.RUNNING:
        # Delivered again: its worker died, or it still runs elsewhere (then leave it be).
        if _still_running(job, now):
            return None
        if job.attempts >= settings.TRAINING_MAX_ATTEMPTS:
            training_job_finish(
                job,
                TrainingJob.Status.FAILED,
                _(
                    "The worker running this job was lost %(n)d times (last: %(w)s); it is not "
                    "started again."
                )
                % {"n": job.attempts, "w": job.worker or "?"},
            )
            return None
    else:
        running = TrainingJob.objects.filter(
            team=job.team_id, status=TrainingJob.Status.RUNNING
        ).count()
        reason = ""
        if running >= concurrency_limit(job.team):
            reason = later(gettext_noop("Waiting: the team runs %(n)d jobs, its limit."), n=running)
        reason = reason or device_hours_check(job.team, job.device_type) or _fair_share(job)
        if reason:
            if job.waiting_reason != reason:
                job.waiting_reason = reason
                job.save(update_fields=["waiting_reason"])
            return reason
    counts = [n for _node, n in live_nodes_with(job.device_type)]
    plan = placement_plan(profile(job.device_type), counts, job.device_count) or (
        1,
        job.device_count,
    )
    try:
        placed = devices_acquire(
            node_name=settings.NODE_NAME,
            device_type=job.device_type,
            count=plan[1],
            nodes=plan[0],
            holder=device_holder(job, job.attempts + 1),
            replaces=device_holder_prefix(job),
            label=f"#{job.pk} {job.name}",
            team=job.team,
            user=job.created_by,
        )
    except DevicesBusy as exc:
        # A job taken again after its worker died waits like any other, queued (its parts on
        # other nodes see that and stop).
        reason = exc.reason
        if job.waiting_reason != reason or job.status != TrainingJob.Status.QUEUED:
            job.waiting_reason, job.status = reason, TrainingJob.Status.QUEUED
            job.save(update_fields=["waiting_reason", "status"])
        return reason
    job.status = TrainingJob.Status.RUNNING
    job.attempts += 1
    job.worker = worker
    job.node = settings.NODE_NAME
    job.devices = [d.index for d in placed[settings.NODE_NAME]]
    # Where each part's node is reached: the launchers meet at the first one's address.
    addresses = dict(Node.objects.filter(name__in=placed).values_list("name", "address"))
    job.placement = [
        {"node": node, "address": addresses.get(node, ""), "devices": [d.index for d in held]}
        for node, held in placed.items()
    ]
    job.rendezvous = ""
    job.pid = os.getpid()
    job.started_at = job.started_at or now
    if job.paused_at is not None:  # resumed: its pause does not count against max_hours
        job.paused_s += max(0.0, (now - job.paused_at).total_seconds())
        job.paused_at = None
    job.heartbeat_at = now
    job.waiting_reason = ""
    job.phase = "preparing"
    job.save()
    return job


def _fair_share(job: TrainingJob) -> str:
    """Why ``job`` lets another team's queued job of its device type and priority go first
    ("" when it need not): that team used the device type less in the last days (usage.
    FAIR_SHARE_DAYS), could start now (under its jobs at once and its device-hours) and fits
    the free devices here. So one team's hundred queued jobs cannot starve another's; ties and
    jobs that could not start anyway never hold a job back (no two jobs wait on each other)."""
    rivals = list(
        TrainingJob.objects.filter(
            status=TrainingJob.Status.QUEUED,
            device_type=job.device_type,
            priority=job.priority,
            cancel_requested=False,
        )
        .exclude(team=job.team_id)
        .select_related("team")
        .order_by("created_at")[:50]
    )
    if not rivals:
        return ""
    used = recent_device_hours([job.team_id, *{r.team_id for r in rivals}], job.device_type)
    free_here = Device.objects.filter(
        node__name=settings.NODE_NAME, device_type=job.device_type, holder=""
    ).count()
    running = dict(
        TrainingJob.objects.filter(
            team__in={r.team_id for r in rivals}, status=TrainingJob.Status.RUNNING
        )
        .values_list("team")
        .annotate(n=Count("pk"))
        .values_list("team", "n")
    )
    for rival in rivals:
        if (used[rival.team_id], rival.team_id) >= (used[job.team_id], job.team_id):
            continue
        if (
            rival.device_count <= free_here
            and running.get(rival.team_id, 0) < concurrency_limit(rival.team)
            and not device_hours_check(rival.team, rival.device_type)
        ):
            return later(
                gettext_noop(
                    "Waiting: another team that used fewer %(device)s devices lately goes "
                    "first (fair share)."
                ),
                device=job.device_type,
            )
    return ""


def _still_running(job: TrainingJob, now) -> bool:
    """Its supervisor beats (every half second); on this node, its process is also alive and
    not this one (a node runs one worker process per device)."""
    if job.node == settings.NODE_NAME and job.pid:
        if job.pid == os.getpid() or not _alive(job.pid):
            return False
    return bool(job.heartbeat_at and (now - job.heartbeat_at).total_seconds() < 30)


def _alive(pid: int) -> bool:
    """A process that runs: not gone, and not a zombie (a pool process killed a moment ago
    that the worker has not reaped yet, while its sibling takes the job back)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


DEVICE_HOLDER_PREFIX = "training_job:"


def device_holder(job: TrainingJob, attempt: int | None = None) -> str:
    """An attempt of the job (its current one by default) as a holder of devices
    (console.Device.holder)."""
    return f"{device_holder_prefix(job)}{job.attempts if attempt is None else attempt}"


def device_holder_prefix(job: TrainingJob) -> str:
    """What every attempt of the job holds devices under."""
    return f"{DEVICE_HOLDER_PREFIX}{job.pk}:"


def training_job_release_devices(job: TrainingJob) -> None:
    """The job's devices are free again (its task ended, however it ended)."""
    devices_release(device_holder(job))


def training_jobs_reconcile() -> list[int]:
    """Beat: a running job whose heartbeat stopped (its whole worker died, so Redis would give
    its task back only after the visibility timeout) is queued again and resumes from its
    checkpoint; devices held by jobs that ended without releasing them are freed; a queued job
    that no live node can take (no node of its device type, none with enough devices) says so.
    Returns the ids queued again."""
    with transaction.atomic():
        stale = timezone.now() - timezone.timedelta(seconds=120)
        requeued = []
        for job in TrainingJob.objects.select_for_update(skip_locked=True).filter(
            status=TrainingJob.Status.RUNNING, heartbeat_at__lt=stale
        ):
            job.celery_task_id = uuid.uuid4().hex
            job.save(update_fields=["celery_task_id"])
            transaction.on_commit(lambda job=job: training_job_enqueue(job))
            requeued.append(job.pk)
    # Devices held by jobs that no longer run (their worker was killed before releasing).
    running = TrainingJob.objects.filter(status=TrainingJob.Status.RUNNING)
    devices_release_all_but(
        DEVICE_HOLDER_PREFIX, {device_holder(job) for job in running.only("pk", "attempts")}
    )
    counts: dict[str, list[int]] = {}  # live nodes' devices, by device type
    for job in TrainingJob.objects.filter(status=TrainingJob.Status.QUEUED):
        if job.device_type not in counts:
            counts[job.device_type] = [n for _node, n in live_nodes_with(job.device_type)]
        found = counts[job.device_type]
        too_few = later(
            gettext_noop("Waiting: no live node has %(n)d %(device)s devices."),
            n=job.device_count,
            device=job.device_type,
        )
        mine = {no_node_reason(job.device_type), too_few}
        if not found:
            reason = no_node_reason(job.device_type)
        elif placement_plan(profile(job.device_type), found, job.device_count) is None:
            reason = too_few
        elif job.waiting_reason in mine:
            reason = ""
        else:
            continue  # a reason the worker gave (the team's limit, devices busy) stands
        if reason != job.waiting_reason:
            TrainingJob.objects.filter(pk=job.pk).update(waiting_reason=reason)
    return requeued
