"""The train worker's run of a claimed job: its work directory prepared (spec, the version's
rows by split, the base model's files, a paused job's checkpoint), the runner started and
supervised (its events stored, cancel, the maximum run time, parts that never meet, the team's
device-hour quota: a pause at the epoch's end), its outputs taken back from the runner's user
and the model version registered, or a paused job's checkpoint kept; and, for a job that spans
nodes, its part on each other node."""

import json
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import DatabaseError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from console.hardware import profile
from console.later import shown
from console.notifications import QUOTA_WARNING_SHARE, notify
from console.usage import device_hours_check, device_hours_share
from runtime import sandbox
from runtime.compress import PARENT_DIR
from runtime.loop import BEST, CHECKPOINT, PAUSE_REQUEST
from runtime.net import free_port
from runtime.run import EVENT_PREFIX
from runtime.spec import Hyperparameters, JobSpec
from runtime.targets import TARGETS_DIR
from training import storage
from training.base_models import base_model_from_job
from training.evaluations import evaluation_register
from training.jobs import training_job_finish, training_job_pause
from training.launch import die_with_parent, runner_device, runner_popen_args, runner_sandbox
from training.models import TrainingEvent, TrainingJob
from training.output import OutputFilter
from training.registry import model_version_register
from training.sweeps import sweep_trial_reported


def job_workdir(job: TrainingJob) -> Path:
    return Path(settings.TRAINING_WORK_DIR) / "jobs" / str(job.pk)


def _prepare_workdir(job: TrainingJob, workdir: Path) -> None:
    """spec.json, the version's rows by split, the base model's files. What an earlier attempt
    left (data, base model, checkpoint) is kept: the runner resumes from its checkpoint. That
    is first taken back from the earlier attempts' runners (their processes killed, every
    entry the platform's), and data or a base model that holds a link is fetched again."""
    if workdir.exists():
        sandbox.take_back(runner_sandbox(job), workdir, also=_earlier_attempts(job))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / PAUSE_REQUEST).unlink(missing_ok=True)
    base_dir = workdir / "base"
    beat = _beater(job)
    if job.resume_files and not (workdir / CHECKPOINT / "state.json").is_file():
        # A paused job resumed on this node: its checkpoint and best weights from storage.
        for name in (CHECKPOINT, BEST):
            shutil.rmtree(workdir / name, ignore_errors=True)
        storage.fetch_dir(job.resume_prefix, job.resume_files, workdir, beat)
    JobSpec(
        job_id=job.pk,
        task_kind=job.task_kind,
        labels=list(job.labels),
        backend=job.backend,
        objective=job.objective,
        preset=job.preset or None,
        base_model_dir=str(base_dir) if job.base_model_id else None,
        hyperparameters=Hyperparameters.from_dict(job.hyperparameters),
        device_type=job.device_type,
        device=runner_device(job),
        device_count=job.device_count,
        visibility_env=profile(job.device_type).visibility_env,
    ).save(workdir)
    data = workdir / "data"
    if not (data / ".complete").is_file() or not sandbox.plain(data):
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir()
        outs = {s: open(data / f"{s}.jsonl", "wb") for s in ("train", "dev", "test")}
        try:
            with default_storage.open(job.dataset_version.data_file, "rb") as f:
                for i, line in enumerate(f):
                    split = json.loads(line).get("split", "train")
                    outs.get(split, outs["train"]).write(line)
                    if i % 10000 == 0:
                        beat()
        finally:
            for out in outs.values():
                out.close()
        (data / ".complete").touch()
    parent_dir = workdir / PARENT_DIR
    if job.objective in TrainingJob.ON_VERSION and (
        not (parent_dir / ".complete").is_file() or not sandbox.plain(parent_dir)
    ):
        # The version a compression job compresses (or an evaluate job scores): its export
        # and export targets.
        version = job.parent_version
        if version is None:
            raise ValueError(_("The job's model version was deleted."))
        shutil.rmtree(parent_dir, ignore_errors=True)
        wanted = {
            rel: meta
            for rel, meta in version.files.items()
            if rel.startswith((storage.MODEL_EXPORT, storage.MODEL_TARGETS))
        }
        storage.fetch_dir(version.storage_prefix, wanted, parent_dir, beat)
        (parent_dir / ".complete").touch()
    if job.base_model_id and (
        not (base_dir / ".complete").is_file() or not sandbox.plain(base_dir)
    ):
        shutil.rmtree(base_dir, ignore_errors=True)
        model = job.base_model
        storage.fetch_dir(model.storage_prefix, model.manifest["files"], base_dir, beat)
        (base_dir / ".complete").touch()


def _beater(job: TrainingJob) -> Callable[[], None]:
    """A heartbeat for the job's attempt while it prepares (at most every 5 s): fetching a large
    base model must not look like a lost worker."""
    last = 0.0

    def beat() -> None:
        nonlocal last
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            TrainingJob.objects.filter(pk=job.pk, attempts=job.attempts).update(
                heartbeat_at=timezone.now()
            )

    return beat


def _earlier_attempts(job: TrainingJob) -> set[int]:
    """The uids of the job's other attempts (whose leftover processes a new one kills)."""
    mine = runner_sandbox(job)
    return sandbox.job_uids(settings.PLATFORM_RUNNER_UID_BASE, job.pk) - {mine.uid}


class _Supervisor:
    """Reads the runner's output, stores its events, and stops it when the job is cancelled."""

    FLUSH_S = 0.5
    LOG_TAIL = 40

    def __init__(self, job: TrainingJob) -> None:
        self.job = job
        self.pending: list[TrainingEvent] = []
        self.fields: dict[str, Any] = {}
        self.log_tail: deque[str] = deque(maxlen=self.LOG_TAIL)
        self.error = ""
        self.cancelled = False
        # The job was taken from this attempt (started again elsewhere, or failed by one of
        # its parts on another node): the runner stops, and the job is left as it is.
        self.superseded = False
        # A job that spans nodes: its processes must meet (and start training) before the
        # runner has been silent this long.
        self.join_within: float | None = None
        self.joined = False
        self.last_event = time.monotonic()
        # Past its maximum run time (from the job's start) the runner is stopped and the job
        # fails with the reason.
        self.max_hours = job.max_hours or settings.TRAINING_MAX_HOURS
        self.deadline = (job.started_at or timezone.now()) + timezone.timedelta(
            hours=self.max_hours, seconds=job.paused_s
        )
        self.timed_out = False
        # Whom the runner runs as: once it exits, every process left of its own uid is killed
        # (one that kept the runner's output open would keep the job running).
        self.user: sandbox.RunnerUser | None = None
        # A trial of a hyperparameter search reported a dev metric: its sweep's pruner is
        # asked, once the event is stored, whether it goes on.
        self.dev_reported = False
        # The team's device-hour quota, checked every TRAINING_QUOTA_CHECK_S: once used, the
        # runner is asked to pause at its epoch's end (why, in ``pausing``), and says it did.
        self.quota_checked = time.monotonic()
        self.pausing = ""
        self.paused: dict[str, Any] | None = None
        self.workdir: Path | None = None
        self.output = OutputFilter()

    def line(self, text: str) -> None:
        text = text.rstrip("\n")
        if not text.startswith(EVENT_PREFIX):
            if text.strip():
                data: dict[str, Any] = {"message": text[:2000]}
                if self.output.is_noise(text):
                    data["noise"] = True  # the full log's, not the panel's nor an error's
                else:
                    self.log_tail.append(text[:2000])
                self._event("log", data)
            return
        try:
            event = json.loads(text[len(EVENT_PREFIX) :])
        except ValueError:
            return
        kind = event.pop("kind", "log")  # "t", the runner's clock, is kept: benchmarks use it
        self.last_event = time.monotonic()
        if kind == "progress":
            self.fields.update(
                step=event["step"],
                total_steps=event["total_steps"],
                epoch=event["epoch"],
                epochs=event["epochs"],
                samples_per_s=event["samples_per_s"],
                eta_s=event["eta_s"],
            )
            if self.job.first_step_at is None:
                self.job.first_step_at = self.fields["first_step_at"] = timezone.now()
            return
        if kind == "state":
            self.fields["phase"] = event["phase"]
            self.joined = self.joined or event["phase"] == "training"
        if kind == "error":
            self.error = event.get("message", "")
        if kind == "paused":
            self.paused = event
        if kind == "metrics" and event.get("split") == "dev" and self.job.sweep_id:
            self.dev_reported = True
        self._event(kind, event)

    def _event(self, kind: str, data: dict) -> None:
        self.pending.append(
            TrainingEvent(job_id=self.job.pk, kind=kind, attempt=self.job.attempts, data=data)
        )

    def flush(self) -> None:
        if self.pending:
            TrainingEvent.objects.bulk_create(self.pending)
            self.pending = []
        if self.dev_reported:
            self.dev_reported = False
            try:
                sweep_trial_reported(self.job.pk)  # pruned: cancel_requested, read below
            except DatabaseError:
                raise
            except Exception as exc:  # the search's bookkeeping never stops the job
                self._event("log", {"message": f"the hyperparameter search's pruner: {exc}"})
        TrainingJob.objects.filter(pk=self.job.pk, attempts=self.job.attempts).update(
            heartbeat_at=timezone.now(), **self.fields
        )
        self.fields = {}
        now = (
            TrainingJob.objects.filter(pk=self.job.pk)
            .values("cancel_requested", "status", "attempts")
            .first()
        )
        if now and now["cancel_requested"]:
            self.cancelled = True
        elif (
            not now
            or now["status"] != TrainingJob.Status.RUNNING
            or now["attempts"] != self.job.attempts
        ):
            self.superseded = True

    def run(self, proc: subprocess.Popen) -> int:
        # Chunks, not readline(): a buffered readline can keep a second line that arrived with
        # the first unread until the runner writes again (half a second later).
        fd = proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        pending = b""
        last_flush = 0.0
        killed_at = None
        exited_at = None
        while True:
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
                if self.user is not None:
                    sandbox.kill_processes(self.user)
            if exited_at is not None and time.monotonic() - exited_at > 5:
                break  # the runner is gone; what still holds its output is not read
            if sel.select(timeout=self.FLUSH_S):
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self.line(line.decode("utf-8", "replace"))
            now = time.monotonic()
            if now - last_flush >= self.FLUSH_S:
                last_flush = now
                self.flush()
                if (self.cancelled or self.superseded) and killed_at is None:
                    killed_at = now
                    _signal_group(proc, signal.SIGTERM)
                if (
                    killed_at is None
                    and not self.pausing
                    and now - self.quota_checked >= settings.TRAINING_QUOTA_CHECK_S
                ):
                    self.quota_checked = now
                    self.check_quota()
                if killed_at is None and timezone.now() >= self.deadline:
                    self.timed_out = True
                    self.error = _(
                        "The job ran past its maximum run time of %(h)s hours (TRAINING_MAX_HOURS "
                        "or the job's max_hours) and was stopped."
                    ) % {"h": f"{self.max_hours:g}"}
                    killed_at = now
                    _signal_group(proc, signal.SIGTERM)
                silent = now - self.last_event
                if (
                    self.join_within
                    and not self.joined
                    and silent > self.join_within
                    and (killed_at is None)
                ):
                    self.error = _(
                        "The job's parts on %(nodes)s did not meet within %(s)d s: is every "
                        "node's train worker up, and the first node's address reachable?"
                    ) % {
                        "nodes": ", ".join(p["node"] for p in self.job.placement),
                        "s": settings.TRAINING_RENDEZVOUS_TIMEOUT_S,
                    }
                    killed_at = now
                    _signal_group(proc, signal.SIGTERM)
            if killed_at is not None and now - killed_at > 5:
                _signal_group(proc, signal.SIGKILL)
        if pending:
            self.line(pending.decode("utf-8", "replace"))
        rc = proc.wait()
        self.flush()
        return rc

    def check_quota(self) -> None:
        """Once the team's device-hours of the month are used (this job's own hold counts up to
        now), the runner is asked to pause at the end of its epoch."""
        team, device = self.job.team, self.job.device_type
        share = device_hours_share(team, device)
        if share is not None and share >= QUOTA_WARNING_SHARE:
            month = timezone.localtime().strftime("%Y-%m")
            notify(
                team,
                "quota_nearly_used",
                _("The team used %(percent)d%% of its %(device)s device-hours this month")
                % {"percent": min(100, int(share * 100)), "device": device},
                link=reverse("console:usage", args=[team.slug]),
                subject=f"quota:{device}:{month}",
            )
        reason = device_hours_check(team, device)
        if not reason or self.workdir is None:
            return
        try:
            # The work directory is the runner's: a new file, never through a link it made.
            fd = os.open(
                self.workdir / PAUSE_REQUEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            )
            os.close(fd)
        except FileExistsError:
            pass
        self.pausing = reason
        self._event(
            "log",
            {
                "message": _(
                    "The team's device-hour quota is used; the job pauses at the end of this "
                    "epoch with a checkpoint. %(reason)s"
                )
                % {"reason": shown(reason)}
            },
        )


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def training_job_execute(job: TrainingJob) -> None:
    """Run a claimed job to its end: prepare, supervise the runner, register the model."""
    workdir = job_workdir(job)
    sup = _Supervisor(job)
    sup.workdir = workdir
    try:
        sup.user = runner_sandbox(job)
        _prepare_workdir(job, workdir)
    except Exception as exc:
        error = _("Preparing the job failed: %(e)s") % {"e": exc}
        training_job_finish(job, TrainingJob.Status.FAILED, error)
        return
    if job.attempts > 1:
        sup._event("log", {"message": f"attempt {job.attempts}: the job starts again"})
    if len(job.placement) > 1:
        _start_parts(job, sup)
        sup.join_within = settings.TRAINING_RENDEZVOUS_TIMEOUT_S
    try:
        started = runner_popen_args(job, workdir)
    except (OSError, ValueError) as exc:
        error = _("Starting the runner failed: %(e)s") % {"e": exc}
        training_job_finish(job, TrainingJob.Status.FAILED, error)
        return
    proc = subprocess.Popen(
        **started,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: cancel kills the whole tree
        preexec_fn=die_with_parent,
    )
    try:
        rc = sup.run(proc)
    except BaseException:
        # The supervisor failed (the database went away): no runner goes on unsupervised. The
        # task is retried and the job resumes from its checkpoint.
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        sandbox.take_back(sup.user, workdir)
        raise
    if sup.superseded:
        # Another attempt (or a part's failure) decided the job's fate: this attempt's
        # processes end; its directory is the other attempt's to take.
        sandbox.kill_processes(sup.user)
        return
    # Every process left of the runner's uid is killed, and what it left is no later
    # runner's to read nor its own to change while the platform reads it.
    sandbox.take_back(sup.user, workdir)
    job.refresh_from_db()
    if sup.cancelled:
        training_job_finish(job, TrainingJob.Status.CANCELLED)
        shutil.rmtree(workdir, ignore_errors=True)
        return
    if rc != 0 or sup.timed_out:
        reason = sup.error or _("The runner exited with status %(rc)d.") % {"rc": rc}
        tail = "\n".join(sup.log_tail)
        training_job_finish(job, TrainingJob.Status.FAILED, f"{reason}\n\n{tail}".strip())
        return
    if sup.paused is not None:
        _pause(job, sup, workdir)
        return
    try:
        # What the runner (another user) left is read as the platform: no links out of it.
        if job.objective == TrainingJob.Objective.EVALUATE:
            # A version scored: its figures and every question's scores, no model.
            sandbox.check_outputs(sup.user, [workdir / "evaluation.json"])
            evaluation_register(job, workdir)
        elif job.objective == TrainingJob.Objective.MLM:
            # Pretraining: best/ becomes a base model of the team, checked as an import is.
            sandbox.check_outputs(sup.user, [workdir / "best", workdir / "evaluation.json"])
            base_model_from_job(job, workdir)
        else:
            outputs = [workdir / "export", workdir / "best", workdir / "evaluation.json"]
            if (workdir / TARGETS_DIR).exists():
                outputs.append(workdir / TARGETS_DIR)
            sandbox.check_outputs(sup.user, outputs)
            model_version_register(job, workdir)
    except Exception as exc:
        training_job_finish(
            job, TrainingJob.Status.FAILED, _("Registering the model failed: %(e)s") % {"e": exc}
        )
        return
    shutil.rmtree(workdir, ignore_errors=True)


def _pause(job: TrainingJob, sup: _Supervisor, workdir: Path) -> None:
    """The runner paused at an epoch's end: its checkpoint and best weights are kept in storage
    (any node may resume the job), and the job is queued again, waiting for its quota."""
    kept = [workdir / name for name in (CHECKPOINT, BEST) if (workdir / name).exists()]
    paused = sup.paused or {}
    try:
        sandbox.check_outputs(sup.user, kept)
        stored = training_job_pause(
            job,
            reason=sup.pausing or device_hours_check(job.team, job.device_type),
            step=int(paused.get("step") or 0),
            epoch=int(paused.get("epoch") or 0),
            kept=kept,
        )
    except Exception as exc:
        training_job_finish(
            job, TrainingJob.Status.FAILED, _("Pausing the job failed: %(e)s") % {"e": exc}
        )
        return
    if stored:
        shutil.rmtree(workdir, ignore_errors=True)


def _start_parts(job: TrainingJob, sup: "_Supervisor") -> None:
    """A job that spans nodes: its launchers meet at a free port of this node, and every other
    node of the placement starts its part (a task on that node's own queue). The work
    directory is shared (TRAINING_WORK_DIR on NFS): the parts read its data and checkpoint."""
    from training.tasks import run_training_job_part

    job.rendezvous = f"{job.placement[0]['address'] or '127.0.0.1'}:{free_port('')}"
    job.save(update_fields=["rendezvous"])
    nodes = ", ".join(f"{p['node']} {p['devices']}" for p in job.placement)
    sup._event("log", {"message": f"the job spans {len(job.placement)} nodes: {nodes}"})
    for part, placed in enumerate(job.placement[1:], start=1):
        run_training_job_part.apply_async(
            (job.pk, part, job.attempts), queue=f"node.{placed['node']}", priority=job.priority
        )


def training_job_part_execute(job_id: int, part: int, attempt: int) -> None:
    """One node's part of a job that spans nodes: its launcher, until the job's processes end
    (the first node supervises and reports), or the job is cancelled or started again."""

    def current() -> bool:
        running = TrainingJob.objects.filter(
            pk=job_id, status=TrainingJob.Status.RUNNING, attempts=attempt
        )
        return running.filter(cancel_requested=False).exists()

    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or not current() or job.placement[part]["node"] != settings.NODE_NAME:
        return
    workdir = job_workdir(job)
    if not (workdir / "spec.json").exists():
        _fail_part(
            job_id,
            attempt,
            _(
                "Node %(node)s does not see the job's work directory %(dir)s: a job that spans "
                "nodes needs TRAINING_WORK_DIR on storage every node mounts."
            )
            % {"node": settings.NODE_NAME, "dir": workdir},
        )
        return
    # The launcher's output goes to a file of the platform's, in a directory the runner
    # cannot reach (not to its own log/, where it could plant a link for root to follow).
    logs = Path(settings.TRAINING_WORK_DIR) / "parts"
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(logs, 0o700)
    log = logs / f"{job_id}-{attempt}-node-{part}.out"
    user = runner_sandbox(job)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    with open(os.open(log, flags, 0o600), "wb") as out:
        proc = subprocess.Popen(
            **runner_popen_args(job, workdir, part),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    stopped_at = None
    while proc.poll() is None:
        time.sleep(1)
        try:
            going = current()
        except DatabaseError:
            continue  # the database away for a moment: the part goes on
        if not going and stopped_at is None:
            stopped_at = time.monotonic()
            _signal_group(proc, signal.SIGTERM)
        if stopped_at is not None and time.monotonic() - stopped_at > 5:
            _signal_group(proc, signal.SIGKILL)
    tail = log.read_bytes()[-1500:].decode("utf-8", "replace")
    log.unlink(missing_ok=True)
    if proc.returncode and stopped_at is None:
        # The first node's own failure, if that is what broke the collective, says more.
        time.sleep(5)
        _fail_part(
            job_id,
            attempt,
            _("Part %(part)d of the job, on node %(node)s, ended with status %(rc)d.")
            % {"part": part, "node": settings.NODE_NAME, "rc": proc.returncode}
            + "\n\n"
            + tail,
        )
    # Nothing of the part outlives the attempt. Killed once the attempt has ended: the uid is
    # the attempt's on every node, and a node may share its machine with another of the job's
    # (whose processes, still at work, are of the same uid).
    waited = time.monotonic()
    while time.monotonic() - waited < 3600:
        try:
            if not current():
                break
        except DatabaseError:
            pass
        time.sleep(1)
    sandbox.kill_processes(user)


def _fail_part(job_id: int, attempt: int, error: str) -> None:
    """A part of a job that spans nodes failed: so does the job (this attempt's, if it still
    runs); its first node sees that and stops its runner."""
    with transaction.atomic():
        job = (
            TrainingJob.objects.select_for_update()
            .filter(pk=job_id, status=TrainingJob.Status.RUNNING, attempts=attempt)
            .first()
        )
        if job is not None:
            training_job_finish(job, TrainingJob.Status.FAILED, error)
