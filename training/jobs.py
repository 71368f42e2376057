"""Training jobs as their users see them: submission and its checks (task kind, backend, base
model or preset, hyperparameters, the device and the live nodes that have it, priority and the
per-user and per-job limits, a large model's rows counted in tokens), the queue of the job's
device type, retry, clone, cancel, and a job's end (its status, audited). What a train worker
does with a job is in ``scheduling`` (the claim) and ``supervision`` (the run)."""

import json
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.files.storage import default_storage
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop
from jinja2 import TemplateError

from console.hardware import placement_plan, profile
from console.later import later
from console.models import Membership, Team
from console.notifications import notify
from console.quotas import team_storage_check
from console.roles import Role
from console.selectors import live_nodes_with
from console.services import audit_record
from labeling.models import DatasetVersion
from runtime.backends import available as available_backends
from runtime.data import HEADS
from runtime.kinds import GENERATIVE_KINDS, TaskKind
from runtime.presets import (
    CPU_TRANSFORMER,
    DEFAULT_PRESET,
    PRESETS,
    default_preset,
    is_fast,
    presets_for,
    recommended,
)
from runtime.spec import Hyperparameters
from training import storage
from training.models import BaseModel, TrainingEvent, TrainingJob
from training.selectors import base_model_named


def _job_labels(version: DatasetVersion) -> list[str]:
    """The dataset's declared labels in their order, else those found in the version."""
    return list(version.dataset.labels) or sorted(version.stats.get("labels", {}))


# A job's time budget (max_minutes) is at most a week.
MAX_BUDGET_MINUTES = 7 * 24 * 60


def recommended_values(task_kind: str, preset: str | None, objective: str = "") -> dict:
    """The hyperparameters recommended for the kind and preset (None: an imported model)."""
    start = asdict(recommended(task_kind, preset=preset))
    if objective == TrainingJob.Objective.MLM:  # pretraining's own (runtime.mlm)
        from runtime.mlm import RECOMMENDED

        start.update(RECOMMENDED["preset" if preset else "base"])
    return start


def _validated_hyperparameters(
    task_kind: str, preset: str | None, given: dict, objective: str = ""
) -> Hyperparameters:
    values = {**recommended_values(task_kind, preset, objective), **(given or {})}
    try:
        hp = Hyperparameters.from_dict(values)
        for name, kind in Hyperparameters.__annotations__.items():
            value = getattr(hp, name)
            if kind == list[str]:
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{name} must be a list of names")
                continue
            if kind is bool and not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false")
            try:
                number = value if kind in (bool, str) else float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be a number, not {value!r}") from None
            if kind is int and (isinstance(value, bool) or number != int(number)):
                raise ValueError(f"{name} must be a whole number, not {value!r}")
            setattr(hp, name, int(number) if kind is int else kind(number))
    except (TypeError, ValueError) as exc:
        raise ValidationError(_("Hyperparameters: %(e)s") % {"e": exc}) from exc
    checks = [
        (hp.epochs >= 1, "epochs ≥ 1"),
        (1 <= hp.batch_size <= 4096, "1 ≤ batch_size ≤ 4096"),
        (0 < hp.learning_rate < 1, "0 < learning_rate < 1"),
        (
            8 <= hp.max_seq_length <= (32768 if task_kind in GENERATIVE_KINDS else 512),
            "8 ≤ max_seq_length ≤ 512 (32768 for instruction and preference data)",
        ),
        (0 <= hp.warmup_ratio < 1, "0 ≤ warmup_ratio < 1"),
        (0 <= hp.weight_decay < 1, "0 ≤ weight_decay < 1"),
        (hp.early_stopping_patience >= 0, "early_stopping_patience ≥ 0"),
        (
            0 <= hp.max_minutes <= MAX_BUDGET_MINUTES,
            f"0 ≤ max_minutes ≤ {MAX_BUDGET_MINUTES} (7 days; 0: no time budget)",
        ),
        (0 < hp.threshold < 1, "0 < threshold < 1"),
        (0 <= hp.dropout < 1, "0 ≤ dropout < 1"),
        (hp.checkpoint_steps >= 0, "checkpoint_steps ≥ 0"),
        (
            hp.metric in ("accuracy", "macro_f1", "micro_f1", "weighted_f1"),
            "metric is accuracy, macro_f1, micro_f1 or weighted_f1",
        ),
        (hp.amp_dtype in ("bfloat16", "float16"), "amp_dtype is bfloat16 or float16"),
        (hp.method in ("lora", "full"), "method is lora or full"),
        (1 <= hp.lora_rank <= 1024, "1 ≤ lora_rank ≤ 1024"),
        (hp.lora_alpha > 0, "lora_alpha > 0"),
        (0 <= hp.lora_dropout < 1, "0 ≤ lora_dropout < 1"),
        (1 <= hp.gradient_accumulation_steps <= 1024, "1 ≤ gradient_accumulation_steps ≤ 1024"),
        (hp.dpo_beta > 0, "dpo_beta > 0"),
        (1 <= hp.max_new_tokens <= 4096, "1 ≤ max_new_tokens ≤ 4096"),
        (0 <= hp.eval_generations <= 200, "0 ≤ eval_generations ≤ 200"),
        (0 <= hp.min_rating <= 5, "0 ≤ min_rating ≤ 5"),
        (0 < hp.mlm_probability < 1, "0 < mlm_probability < 1"),
    ]
    for ok, rule in checks:
        if not ok:
            raise ValidationError(_("Hyperparameters: %(rule)s.") % {"rule": rule})
    return hp


# Rows over the token limit listed in a job's data report (all are counted).
TOKEN_REPORT_ROWS = 200


def token_report(
    version: DatasetVersion, model: BaseModel | None, task_kind: str, limit: int
) -> dict:
    """Each answered row of an instruction or preference version counted in tokens, as the
    runner will count it (the base model's tokenizer and chat template, or the preset's
    characters and ChatML): how many there are per split, and the rows over ``limit`` (by
    their number in the version), which the job leaves out."""
    from runtime.chat import TOKENIZER_FILES, ChatTokenizer, build_char_tokenizer, encode_row
    from runtime.data import is_labeled

    with default_storage.open(version.data_file, "rb") as f:
        rows = [(n, json.loads(line)) for n, line in enumerate(f, start=1)]
    rows = [(n, r) for n, r in rows if is_labeled(task_kind, r)]
    with tempfile.TemporaryDirectory(prefix="tokenizer-") as tmp:
        if model is None:
            from runtime.llm import texts_of

            tok = build_char_tokenizer((t for _n, r in rows for t in texts_of(r)), Path(tmp))
        else:
            files = {n: m for n, m in model.manifest["files"].items() if n in TOKENIZER_FILES}
            storage.fetch_dir(model.storage_prefix, files, Path(tmp))
            tok = ChatTokenizer(Path(tmp))
        counts: dict[str, int] = {}
        over, longest = [], 0
        for number, row in rows:
            _example, length = encode_row(task_kind, tok, row)
            split = row.get("split", "train")
            counts[split] = counts.get(split, 0) + 1
            longest = max(longest, length)
            if length > limit:
                over.append({"row": number, "split": split, "tokens": length})
    return {
        "limit": limit,
        "rows": counts,
        "longest": longest,
        "over": len(over),
        "over_train": sum(o["split"] == "train" for o in over),
        "over_rows": over[:TOKEN_REPORT_ROWS],
    }


# Backends whose jobs run on several devices, under their framework's launcher (runner_command).
MULTI_DEVICE_BACKENDS = ("paddle", "torch")


@dataclass(frozen=True)
class JobPlan:
    """What a job on these choices trains: the task kind, the base model or the preset that the
    defaults resolve to, and the hyperparameters recommended for them (before the user's)."""

    kind: str
    generative: bool
    pretrain: bool
    model: BaseModel | None
    preset: str
    name: str
    recommended: dict


def job_plan(
    *,
    team: Team,
    dataset_version: DatasetVersion,
    backend: str = "paddle",
    base_model: str = "",
    preset: str = "",
    device_type: str = "cpu",
    device_count: int = 1,
    objective: str = "",
    name: str = "",
) -> JobPlan:
    """The model a job would train, resolved and checked as its submission does; the new-job
    form's live preview and ``training_job_submit`` both ask it."""
    dataset = dataset_version.dataset
    if dataset.team_id != team.pk:
        raise ValidationError(_("No such dataset version."))
    kind = dataset.task_kind
    generative = kind in GENERATIVE_KINDS
    if kind == TaskKind.EVALUATION:
        raise ValidationError(
            _("An evaluation set is not trained on: score a large model on it from its page.")
        )
    if kind not in HEADS and not generative:
        raise ValidationError(_("Task kind %(kind)s cannot be trained yet.") % {"kind": kind})
    if backend not in available_backends():
        raise ValidationError(
            _("No training backend named “%(b)s”; installed: %(all)s.")
            % {"b": backend, "all": ", ".join(sorted(available_backends()))}
        )
    if base_model and preset:
        raise ValidationError(_("Choose a base model or a preset, not both."))
    pretrain = objective == TrainingJob.Objective.MLM
    if pretrain:
        name = pretraining_checks(team, dataset_version, backend, name, device_count)
    elif objective:
        raise ValidationError(_("Unknown objective “%(o)s”.") % {"o": objective})
    model = base_model_named(team, base_model, backend) if base_model else None
    if model is None and pretrain:
        # A transformer: the fast models have no masked-language-model head.
        preset = preset or (CPU_TRANSFORMER if device_type == "cpu" else DEFAULT_PRESET)
        if preset not in PRESETS:
            raise ValidationError(
                _("Pretraining trains a transformer preset (%(all)s) or an imported encoder.")
                % {"all": ", ".join(PRESETS)}
            )
    if model is None:
        # The fast model of the kind on a CPU, a transformer on an accelerator (runtime.presets).
        preset = preset or default_preset(
            kind, backend, accelerated=device_type != "cpu", devices=device_count
        )
        if preset not in presets_for(kind, backend):
            raise ValidationError(
                _(
                    "No preset named “%(p)s” for %(kind)s on the %(backend)s backend; "
                    "presets: %(all)s."
                )
                % {
                    "p": preset,
                    "kind": kind,
                    "backend": backend,
                    "all": ", ".join(presets_for(kind, backend)),
                }
            )
    elif bool(model.summary.get("causal_lm")) != generative:
        raise ValidationError(
            _("%(model)s is a causal language model: it trains instruction and preference data.")
            % {"model": model.name}
            if model.summary.get("causal_lm")
            else _("%(model)s is an encoder; instruction and preference data need a causal LM.")
            % {"model": model.name}
        )
    return JobPlan(
        kind=kind,
        generative=generative,
        pretrain=pretrain,
        model=model,
        preset="" if model else preset,
        name=name,
        recommended=recommended_values(kind, None if model else preset, objective),
    )


def training_job_submit(
    *,
    actor: AbstractBaseUser,
    team: Team,
    dataset_version: DatasetVersion,
    backend: str = "paddle",
    base_model: str = "",
    preset: str = "",
    hyperparameters: dict | None = None,
    device_type: str = "cpu",
    device_count: int = 1,
    priority: int = TrainingJob.Priority.NORMAL,
    name: str = "",
    origin: TrainingJob | None = None,
    max_hours: float | None = None,
    objective: str = "",
) -> TrainingJob:
    """Queue a training job on the queue of its device type. Checked and tokenised outside
    any transaction: only the job's row is written in one (SQLite's write lock is short).
    ``objective`` "mlm" pretrains an encoder on the version's texts instead: its result is a
    base model of the team named ``name`` (``pretraining_checks``)."""
    plan = job_plan(
        team=team,
        dataset_version=dataset_version,
        backend=backend,
        base_model=base_model,
        preset=preset,
        device_type=device_type,
        device_count=device_count,
        objective=objective,
        name=name,
    )
    dataset, kind, generative, pretrain = (
        dataset_version.dataset,
        plan.kind,
        plan.generative,
        plan.pretrain,
    )
    model, preset, name = plan.model, plan.preset, plan.name
    labels = [] if generative or pretrain else _job_labels(dataset_version)
    if not generative and not pretrain and len(labels) < (1 if kind == "ner" else 2):
        raise ValidationError(
            _("%(v)s has %(n)d label(s): a model needs at least two classes (one entity type).")
            % {"v": dataset_version, "n": len(labels)}
        )
    if not pretrain and not dataset_version.split_counts.get("train"):
        raise ValidationError(_("%(v)s has no rows in its train split.") % {"v": dataset_version})
    try:
        device = profile(device_type)
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc
    # Mixed precision by default where the device's profile says it is supported, in bfloat16
    # where it has it.
    given = {"amp": device.amp, "amp_dtype": "bfloat16" if device.bf16 else "float16"}
    given.update(hyperparameters or {})
    hp = _validated_hyperparameters(kind, None if model else preset, given, objective)
    if hp.amp and not device.amp:
        raise ValidationError(
            _("Mixed precision (amp) is not supported on %(device)s.") % {"device": device.label}
        )
    if hp.amp and hp.amp_dtype == "bfloat16" and not device.bf16:
        raise ValidationError(
            _("%(device)s has no bfloat16: choose amp_dtype float16.") % {"device": device.label}
        )
    if device_count < 1:
        raise ValidationError(_("A job needs at least one device."))
    if device_count > 1 and generative:
        raise ValidationError(_("Large models train on one device for now."))
    if device_count > 1 and is_fast(preset):
        raise ValidationError(
            _("%(p)s trains on one device: its n-gram tables have sparse gradients.")
            % {"p": preset}
        )
    if backend == "torch" and device.paddle_device not in ("cpu", "gpu"):
        raise ValidationError(
            _("The torch backend runs on CPUs and CUDA or ROCm cards, not on %(device)s.")
            % {"device": device.label}
        )
    if device_count > 1 and backend not in MULTI_DEVICE_BACKENDS:
        raise ValidationError(
            _(
                "Training on several devices runs on the paddle and torch backends (their "
                "launchers); the %(backend)s backend trains on one device."
            )
            % {"backend": backend}
        )
    if priority not in TrainingJob.Priority.values:
        raise ValidationError(_("Unknown priority %(p)s.") % {"p": priority})
    _check_priority(actor, team, priority)
    max_hours = _checked_max_hours(max_hours)
    nodes = live_nodes_with(device.name)
    counts = [n for _node, n in nodes]
    if nodes and placement_plan(device, counts, device_count) is None:
        most = max(counts)
        if not device.multi_node:
            raise ValidationError(
                _(
                    "No node has %(n)d %(device)s devices: the most on one node is %(most)d "
                    "(%(nodes)s). A job of this device type runs on the devices of one node."
                )
                % {
                    "n": device_count,
                    "device": device.label,
                    "most": most,
                    "nodes": ", ".join(node.name for node, n in nodes if n == most),
                }
            )
        message = _(
            "The live nodes cannot hold %(n)d %(device)s devices in equal shares (a job "
            "spans nodes with as many devices on each): they have %(counts)s."
        ) % {
            "n": device_count,
            "device": device.label,
            "counts": ", ".join(f"{node.name} {n}" for node, n in nodes),
        }
        if device.name == "cpu":
            message += " " + _(
                "A node's CPU counts as PLATFORM_CPU_SLOTS devices (1 by default): raise it "
                "there, or ask for fewer."
            )
        raise ValidationError(message)
    data_report = {}
    if generative:
        try:
            data_report = token_report(dataset_version, model, kind, hp.max_seq_length)
        except (ValueError, OSError, TemplateError) as exc:  # a template that fails, a damaged file
            raise ValidationError(_("The rows could not be tokenised: %(e)s") % {"e": exc}) from exc
        if data_report["over_train"] >= data_report["rows"].get("train", 0):
            raise ValidationError(
                _(
                    "Every training row is over the token limit of %(limit)d (the longest has "
                    "%(longest)d tokens): raise max_seq_length."
                )
                % {"limit": hp.max_seq_length, "longest": data_report["longest"]}
            )
    with transaction.atomic():
        _check_user_limit(actor)
        job = TrainingJob.objects.create(
            team=team,
            name=name.strip()[:100] or f"{dataset.name} v{dataset_version.number}",
            dataset_version=dataset_version,
            task_kind=kind,
            labels=labels,
            base_model=model,
            preset="" if model else preset,
            backend=backend,
            objective=objective,
            hyperparameters=asdict(hp),
            device_type=device.name,
            device_count=device_count,
            priority=priority,
            max_hours=max_hours,
            origin=origin,
            data_report=data_report,
            waiting_reason="" if nodes else no_node_reason(device.name),
            celery_task_id=uuid.uuid4().hex,
            created_by=actor,
        )
        audit_record(
            action="training.job_submit",
            actor=actor,
            team=team,
            target=job,
            data={
                "dataset_version": str(dataset_version),
                "backend": backend,
                "model": job.model_source,
                "device": f"{device.name}×{device_count}",
                "origin": origin.pk if origin else None,
                **({"objective": objective} if objective else {}),
            },
        )
        transaction.on_commit(lambda: training_job_enqueue(job))
    return job


def pretraining_checks(
    team: Team, version: DatasetVersion, backend: str, name: str, device_count: int
) -> str:
    """A pretraining job (objective "mlm"): of an encoder's task kind, on the paddle backend and
    one device, with rows to read; returns the name its base model will have (the job's name,
    by default ``<dataset>-dapt``), which no base model nor active pretraining of the team
    has."""
    if version.dataset.task_kind in GENERATIVE_KINDS:
        raise ValidationError(
            _(
                "Pretraining (masked language modelling) makes an encoder; instruction and "
                "preference data train a causal LM."
            )
        )
    if backend != "paddle":
        raise ValidationError(_("Pretraining runs on the paddle backend for now."))
    if device_count != 1:
        raise ValidationError(_("Pretraining runs on one device for now."))
    if not version.row_count:
        raise ValidationError(_("%(v)s has no rows to pretrain on.") % {"v": version})
    name = name.strip()[:100] or f"{version.dataset.name}-dapt"
    taken = BaseModel.objects.filter(team=team, name=name).exists() or (
        TrainingJob.objects.filter(
            team=team, name=name, objective=TrainingJob.Objective.MLM, status__in=TrainingJob.ACTIVE
        ).exists()
    )
    if taken:
        raise ValidationError(
            _(
                "The team has a base model (or a pretraining under way) named “%(name)s”: name "
                "the job, its result is the base model of that name."
            )
            % {"name": name}
        )
    return name


def _check_priority(actor: AbstractBaseUser, team: Team, priority: int) -> None:
    """The top priority jumps every queue of shared accelerators: the team's owners and site
    staff only."""
    if priority != TrainingJob.Priority.TOP or actor.is_staff:
        return
    if not Membership.objects.filter(team=team, user=actor, role=Role.OWNER).exists():
        raise PermissionDenied(
            _("The top priority is for the team's owners and site staff; choose high at most.")
        )


def _checked_max_hours(max_hours: float | None) -> float:
    """The job's maximum run time: TRAINING_MAX_HOURS, or less if it asks for less."""
    limit = float(settings.TRAINING_MAX_HOURS)
    if max_hours is None:
        return limit
    if not 0 < max_hours <= limit:
        raise ValidationError(
            _("A job runs at most %(limit)s hours on this site (TRAINING_MAX_HOURS); %(h)s asked.")
            % {"limit": f"{limit:g}", "h": f"{max_hours:g}"}
        )
    return float(max_hours)


def _check_user_limit(actor: AbstractBaseUser) -> None:
    """Per user, over all their teams: a user in several teams (or who made several) gets no
    more than TRAINING_MAX_CONCURRENT_PER_USER queued or running jobs. Called in the job's
    transaction with the user's row locked, so that two submissions do not both pass."""
    get_user_model().objects.select_for_update().filter(pk=actor.pk).first()
    limit = settings.TRAINING_MAX_CONCURRENT_PER_USER
    active = TrainingJob.objects.filter(created_by=actor, status__in=TrainingJob.ACTIVE).count()
    if active >= limit:
        raise ValidationError(
            _(
                "You have %(n)d training jobs queued or running (in all your teams); the limit "
                "is %(limit)d a user (TRAINING_MAX_CONCURRENT_PER_USER). Wait for one to end "
                "or cancel one."
            )
            % {"n": active, "limit": limit}
        )


def training_job_enqueue(job: TrainingJob, countdown: float | None = None) -> None:
    """The job's task on the queue of its device type, at its priority, under its task id."""
    from training.tasks import run_training_job  # the tasks import the worker's modules

    run_training_job.apply_async(
        (job.pk,),
        task_id=job.celery_task_id,
        queue=profile(job.device_type).queue,
        priority=job.priority,
        countdown=countdown,
    )


def no_node_reason(device_type: str) -> str:
    """Why a job waits when no live node has its device type (its ``waiting_reason``, a
    console.later message)."""
    return later(
        gettext_noop(
            "Waiting: no live node has a %(device)s device (queue %(queue)s); see the nodes page."
        ),
        device=device_type,
        queue=profile(device_type).queue,
    )


def _spec_fields(job: TrainingJob) -> dict:
    if job.objective in TrainingJob.ON_VERSION:  # training.compression's, evaluations'
        raise ValidationError(
            _("A compression or evaluation job is started again from its model version's page.")
        )
    return {
        "dataset_version": job.dataset_version,
        "backend": job.backend,
        "base_model": job.base_model.name if job.base_model_id else "",
        "preset": job.preset,
        "objective": job.objective,
        "hyperparameters": dict(job.hyperparameters),
        "device_type": job.device_type,
        "device_count": job.device_count,
        "priority": job.priority,
        # A retry keeps its limit, within the site's (which may have been lowered since).
        "max_hours": min(job.max_hours, settings.TRAINING_MAX_HOURS) if job.max_hours else None,
    }


def training_job_retry(*, actor: AbstractBaseUser, job: TrainingJob) -> TrainingJob:
    """A new job with the same spec as a failed or cancelled one."""
    if job.status not in (TrainingJob.Status.FAILED, TrainingJob.Status.CANCELLED):
        raise ValidationError(_("Only a failed or cancelled job can be retried."))
    return training_job_submit(
        actor=actor, team=job.team, origin=job, name=job.name, **_spec_fields(job)
    )


def training_job_clone(
    *, actor: AbstractBaseUser, job: TrainingJob, changes: dict[str, Any]
) -> TrainingJob:
    """A new job like ``job`` with ``changes``: hyperparameters (merged), backend, base_model,
    preset, device_type, device_count, priority, name."""
    fields = _spec_fields(job)
    unknown = set(changes) - set(fields) - {"name"}
    if unknown:
        raise ValidationError(_("Unknown field(s): %(f)s.") % {"f": ", ".join(sorted(unknown))})
    fields["hyperparameters"].update(changes.pop("hyperparameters", None) or {})
    if changes.get("base_model"):
        fields["preset"] = ""
    if changes.get("preset"):
        fields["base_model"] = ""
    fields.update(changes)
    name = fields.pop("name", "") or f"{job.name} (clone)"
    return training_job_submit(actor=actor, team=job.team, origin=job, name=name, **fields)


@transaction.atomic
def training_job_cancel(*, actor: AbstractBaseUser, job: TrainingJob) -> TrainingJob:
    """A queued job leaves the queue at once; a running one is stopped by its worker within
    about a second (its process group is killed)."""
    job = TrainingJob.objects.select_for_update().get(pk=job.pk)
    if not job.is_active:
        raise ValidationError(
            _("The job is %(status)s already; there is nothing to cancel.")
            % {"status": job.get_status_display()}
        )
    job.cancel_requested = True
    if job.status == TrainingJob.Status.QUEUED:
        job.status = TrainingJob.Status.CANCELLED
        job.finished_at = timezone.now()
        task_id = job.celery_task_id
        transaction.on_commit(lambda: _revoke(task_id))
    job.save(update_fields=["cancel_requested", "status", "finished_at"])
    if job.status == TrainingJob.Status.CANCELLED:
        _advance_sweep_on_commit(job)
    audit_record(action="training.job_cancel", actor=actor, team=job.team, target=job)
    return job


def _advance_sweep_on_commit(job: TrainingJob) -> None:
    """A trial of a hyperparameter search ended: its sweep queues the next or ends
    (training.sweeps, on the default queue). A message lost is made up by beat's round."""
    if job.sweep_id is None:
        return
    from training.tasks import advance_sweep  # the tasks import the worker's modules

    sweep_id = job.sweep_id
    transaction.on_commit(lambda: advance_sweep.delay(sweep_id), robust=True)


def _revoke(task_id: str) -> None:
    from console.celery import app

    app.control.revoke(task_id)


def training_job_pause(
    job: TrainingJob, *, reason: str, step: int, epoch: int, kept: list[Path]
) -> bool:
    """The runner paused at the end of ``epoch`` (its team's device-hour quota used, ``reason``
    saying the quota, the use and when it resets): ``kept`` (its checkpoint and best weights)
    go to storage, so that any node of its device type resumes it, and the job is queued
    again; it waits for its quota like any job, and is audited. Returns whether the
    checkpoint was stored: past the team's storage quota it stays on this node only (the job
    resumes from it here, or starts again elsewhere)."""
    files: dict[str, dict] = {}
    note = ""
    try:
        team_storage_check(job.team, sum(storage.dir_size(path) for path in kept))
    except ValidationError as exc:
        note = " ".join(exc.messages)
    else:
        storage.delete_prefix(job.resume_prefix, job.resume_files)
        for path in kept:
            stored = storage.store_dir(path, f"{job.resume_prefix}{path.name}/")
            files.update({f"{path.name}/{rel}": meta for rel, meta in stored.items()})
    message = _(
        "Paused after epoch %(epoch)d (step %(step)d) with its checkpoint; it resumes from there "
        "when the team's quota allows."
    ) % {"epoch": epoch, "step": step}
    if note:
        message += " " + _("Its checkpoint stays on node %(node)s: %(note)s") % {
            "node": job.node,
            "note": note,
        }
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        job.status = TrainingJob.Status.QUEUED
        job.paused_at = timezone.now()
        job.resume_files = files
        job.waiting_reason = reason
        job.phase = ""
        job.eta_s = None
        # A new task under a new id: this one is still running (it releases the devices).
        job.celery_task_id = uuid.uuid4().hex
        job.save(
            update_fields=[
                "status", "paused_at", "resume_files", "waiting_reason", "phase", "eta_s",
                "celery_task_id",
            ]
        )  # fmt: skip
        TrainingEvent.objects.create(
            job=job, kind="log", attempt=job.attempts, data={"message": message}
        )
        audit_record(
            action="training.job_paused",
            actor=None,
            actor_username="system",
            team=job.team,
            target=job,
            data={"step": step, "epoch": epoch, "reason": reason[:500], "stored": bool(files)},
        )
        transaction.on_commit(lambda: training_job_enqueue(job, countdown=5))
    return bool(files)


def _notify_finished(job: TrainingJob) -> None:
    """The team is told that a job succeeded or failed (console/notifications.py)."""
    if job.status == TrainingJob.Status.SUCCEEDED:
        event, title = "job_succeeded", _("Training job %(name)s (#%(id)d) succeeded")
    elif job.status == TrainingJob.Status.FAILED:
        event, title = "job_failed", _("Training job %(name)s (#%(id)d) failed")
    else:
        return
    notify(
        job.team,
        event,
        title % {"name": job.name, "id": job.pk},
        body=job.error[:1000],
        link=reverse("training:job", args=[job.team.slug, job.pk]),
        subject=f"job:{job.pk}:{job.status}",
    )


def training_job_finish(job: TrainingJob, status: str, error: str = "") -> None:
    """The job's end (succeeded, failed with ``error``, cancelled), audited as the system's:
    called by the worker that ran it and by the claim that finds it over. A paused job's
    stored checkpoint is deleted."""
    if job.resume_files:
        storage.delete_prefix(job.resume_prefix, job.resume_files)
        job.resume_files = {}
        job.paused_at = None
        TrainingJob.objects.filter(pk=job.pk).update(resume_files={}, paused_at=None)
    job.status = status
    job.error = error
    job.finished_at = timezone.now()
    job.phase = ""
    job.eta_s = None
    job.save(update_fields=["status", "error", "finished_at", "phase", "eta_s"])
    _advance_sweep_on_commit(job)
    _notify_finished(job)
    audit_record(
        action=f"training.job_{status}",
        actor=None,
        actor_username="system",
        team=job.team,
        target=job,
        data={"error": error[:500]} if error else {},
    )
