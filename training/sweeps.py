"""Hyperparameter search: a sweep is ``n_trials`` training jobs over the ranges the user ticked,
``parallel`` of them queued at once (through ``training_job_submit``: they queue, wait and run
like any job, wherever devices are free). Each trial's hyperparameters are asked of Optuna (TPE),
a running trial whose dev metric falls below the median of the finished trials' at the same
epoch is pruned (cancelled), and once every trial has ended the best one's model version is kept
and the others' deleted.

The truth is our database, not Optuna's storage (whose SQLAlchemy tables would live outside
Django's migrations): every decision rebuilds an in-memory study from the sweep's jobs, their
hyperparameters and the dev metrics their runners reported (``TrainingEvent`` "metrics").

Called by: the API and the console (create, cancel), ``jobs.training_job_finish`` (a trial's
end advances its sweep, through the ``advance_sweep`` task), the supervisor (a trial's dev
metric: prune?) and beat's reconciliation (advance every running sweep, in case a message was
lost)."""

import math
import warnings
from typing import Any

import optuna
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext as _
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState, create_trial

from console.models import Team
from console.services import audit_record
from labeling.models import DatasetVersion
from runtime.data import HEADS
from runtime.presets import default_preset, recommended
from training.jobs import _validated_hyperparameters, training_job_cancel, training_job_submit
from training.models import DEV_METRICS, ModelVersion, Sweep, TrainingEvent, TrainingJob
from training.registry import model_version_delete

optuna.logging.set_verbosity(optuna.logging.WARNING)

# What a sweep may search, and each one's type.
SEARCHABLE: dict[str, type] = {
    "learning_rate": float,
    "batch_size": int,
    "dropout": float,
    "weight_decay": float,
    "epochs": int,
    "warmup_ratio": float,
    "max_seq_length": int,
}
MAX_TRIALS = 200
MAX_CHOICES = 20
# Pruning: a trial is judged from its second epoch (the first is mostly warm-up), once two
# trials have finished.
PRUNE_STARTUP_TRIALS = 2
PRUNE_WARMUP_EPOCHS = 2


# -- The space ---------------------------------------------------------------------------------


def _number(name: str, value: Any) -> int | float:
    kind = SEARCHABLE[name]
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValidationError(_("%(name)s: %(v)r is not a number.") % {"name": name, "v": value})
    try:
        number = float(value)
    except ValueError:
        raise ValidationError(
            _("%(name)s: %(v)r is not a number.") % {"name": name, "v": value}
        ) from None
    if not math.isfinite(number):
        raise ValidationError(_("%(name)s: %(v)r is not a number.") % {"name": name, "v": value})
    if kind is int:
        if number != int(number):
            raise ValidationError(
                _("%(name)s takes whole numbers, not %(v)s.") % {"name": name, "v": value}
            )
        return int(number)
    return number


def checked_space(task_kind: str, preset: str | None, space: Any) -> dict[str, dict]:
    """The space as stored: per hyperparameter ``{"low", "high", "log"}`` or ``{"choices"}``,
    each value within what a job accepts (``jobs._validated_hyperparameters``)."""
    if not isinstance(space, dict) or not space:
        raise ValidationError(_("Tick at least one hyperparameter to search."))
    checked: dict[str, dict] = {}
    for name, entry in space.items():
        if name not in SEARCHABLE:
            raise ValidationError(
                _("%(name)s cannot be searched; these can: %(all)s.")
                % {"name": name, "all": ", ".join(SEARCHABLE)}
            )
        if not isinstance(entry, dict):
            raise ValidationError(
                _("%(name)s: give a range (low, high) or a list of choices.") % {"name": name}
            )
        if "choices" in entry:
            choices = entry["choices"]
            if not isinstance(choices, list) or not 1 <= len(choices) <= MAX_CHOICES:
                raise ValidationError(
                    _("%(name)s: give 1 to %(n)d choices.") % {"name": name, "n": MAX_CHOICES}
                )
            values = list(dict.fromkeys(_number(name, c) for c in choices))
            for value in values:
                _validated_hyperparameters(task_kind, preset, {name: value})
            checked[name] = {"choices": values}
            continue
        if entry.get("low") in (None, "") or entry.get("high") in (None, ""):
            raise ValidationError(_("%(name)s: give the low and the high end.") % {"name": name})
        low, high = _number(name, entry["low"]), _number(name, entry["high"])
        log = bool(entry.get("log", False))
        if not low < high:
            raise ValidationError(
                _("%(name)s: the low end (%(low)s) must be below the high end (%(high)s).")
                % {"name": name, "low": low, "high": high}
            )
        if log and low <= 0:
            raise ValidationError(
                _("%(name)s: a logarithmic range starts above 0.") % {"name": name}
            )
        for value in (low, high):
            _validated_hyperparameters(task_kind, preset, {name: value})
        checked[name] = {"low": low, "high": high, "log": log}
    return checked


def distributions(space: dict[str, dict]) -> dict[str, BaseDistribution]:
    """Optuna's distribution of each hyperparameter searched."""
    out: dict[str, BaseDistribution] = {}
    for name, entry in space.items():
        if "choices" in entry:
            out[name] = CategoricalDistribution(tuple(entry["choices"]))
        elif SEARCHABLE[name] is int:
            out[name] = IntDistribution(int(entry["low"]), int(entry["high"]), log=entry["log"])
        else:
            out[name] = FloatDistribution(
                float(entry["low"]), float(entry["high"]), log=entry["log"]
            )
    return out


# -- The study, rebuilt from the database ------------------------------------------------------


def _add_point(curve: dict[int, float], data: dict, metric: str) -> None:
    value = (data.get("metrics") or {}).get(metric)
    if data.get("split") != "dev" or data.get("epoch") is None:
        return
    if isinstance(value, int | float) and math.isfinite(value):
        curve[int(data["epoch"])] = float(value)


def dev_curve(job: TrainingJob, metric: str) -> dict[int, float]:
    """The trial's dev metric by epoch, as its runner reported it (a later attempt's figures
    replace an earlier one's)."""
    curve: dict[int, float] = {}
    for data in job.events.filter(kind="metrics").order_by("id").values_list("data", flat=True):
        _add_point(curve, data, metric)
    return curve


def trial_figures(
    trials: list[TrainingJob], metric: str
) -> dict[int, tuple[dict[int, float], float | None]]:
    """Per trial (by job id), in two queries: its dev metric by epoch, and for a succeeded one
    its objective, the dev metric of its best checkpoint (the one its model version exports:
    from its evaluation's history, else from its reported dev metrics)."""
    ids = [t.pk for t in trials]
    curves: dict[int, dict[int, float]] = {i: {} for i in ids}
    events = TrainingEvent.objects.filter(job_id__in=ids, kind="metrics").order_by("id")
    for job_id, data in events.values_list("job_id", "data"):
        _add_point(curves[job_id], data, metric)
    evaluations = dict(
        ModelVersion.objects.filter(job_id__in=ids).values_list("job_id", "evaluation")
    )
    figures: dict[int, tuple[dict[int, float], float | None]] = {}
    for job in trials:
        curve, value = curves[job.pk], None
        if job.status == TrainingJob.Status.SUCCEEDED:
            history = (evaluations.get(job.pk) or {}).get("history", [])
            values = [h[metric] for h in history if isinstance(h.get(metric), int | float)]
            values = values or list(curve.values())
            value = max(values) if values else None
        figures[job.pk] = (curve, value)
    return figures


def trial_value(job: TrainingJob, metric: str) -> float | None:
    """A succeeded trial's objective (``trial_figures``)."""
    return trial_figures([job], metric)[job.pk][1]


def _frozen(
    job: TrainingJob,
    dists: dict[str, BaseDistribution],
    curve: dict[int, float],
    value: float | None,
) -> FrozenTrial | None:
    """The job as a trial of the study: complete with its value, pruned, running, or failed
    (a trial whose hyperparameters lie outside the space is left out)."""
    params = {name: job.hyperparameters.get(name) for name in dists}
    if job.status == TrainingJob.Status.SUCCEEDED:
        state = TrialState.COMPLETE if value is not None else TrialState.FAIL
    elif job.pruned and not job.is_active:
        state = TrialState.PRUNED
    elif job.is_active:
        state = TrialState.RUNNING
    else:
        state = TrialState.FAIL
    try:
        return create_trial(
            state=state,
            value=value if state == TrialState.COMPLETE else None,
            params=params,
            distributions=dists,
            intermediate_values=curve,
        )
    except ValueError:
        return None


def _pruner() -> optuna.pruners.BasePruner:
    return optuna.pruners.MedianPruner(
        n_startup_trials=PRUNE_STARTUP_TRIALS, n_warmup_steps=PRUNE_WARMUP_EPOCHS
    )


def build_study(sweep: Sweep, trials: list[TrainingJob], seed_offset: int = 0) -> optuna.Study:
    """An in-memory study of the sweep's trials. The sampler's seed moves with each trial asked
    (the study is rebuilt for each: one seed would draw the same random start every time);
    running trials are in it, and TPE's constant liar keeps from asking their neighbourhood
    again while they run."""
    dists = distributions(sweep.space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            seed=sweep.seed + seed_offset,
            n_startup_trials=max(2, min(10, sweep.n_trials // 3)),
            constant_liar=True,
        )
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=_pruner())
    figures = trial_figures(trials, sweep.metric)
    for job in trials:
        frozen = _frozen(job, dists, *figures[job.pk])
        if frozen is not None:
            study.add_trial(frozen)
    return study


def _defaults_in_space(sweep: Sweep, kind: str) -> dict:
    """The recommended values that lie in the space: the first trial tries them, so the search
    starts from the default and only a better trial beats it."""
    default = vars(recommended(kind, preset=sweep.preset or None))
    params = {}
    for name, entry in sweep.space.items():
        value = sweep.hyperparameters.get(name, default.get(name))
        if "choices" in entry:
            if value in entry["choices"]:
                params[name] = value
        elif value is not None and entry["low"] <= value <= entry["high"]:
            params[name] = value
    return params


def param_importances(sweep: Sweep, trials: list[TrainingJob]) -> dict[str, float]:
    """How much each hyperparameter mattered to the dev metric (Optuna's PED-ANOVA, which needs
    no other library), once two trials have finished; empty before, or where it cannot say."""
    study = build_study(sweep, trials)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return {}
    # PED-ANOVA compares the best trials with all: with few trials, the best half.
    quantile = max(0.1, min(0.5, 2 / len(complete)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
            found = optuna.importance.get_param_importances(study, evaluator=evaluator)
        except (ValueError, RuntimeError, ZeroDivisionError):
            return {}
    return {name: round(float(v), 4) for name, v in found.items() if math.isfinite(v)}


# -- Use cases ---------------------------------------------------------------------------------


def sweep_create(
    *,
    actor: AbstractBaseUser,
    team: Team,
    dataset_version: DatasetVersion,
    space: dict,
    n_trials: int = 10,
    parallel: int = 1,
    backend: str = "paddle",
    base_model: str = "",
    preset: str = "",
    device_type: str = "cpu",
    metric: str = "macro_f1",
    hyperparameters: dict | None = None,
    name: str = "",
    seed: int = 0,
) -> Sweep:
    """A sweep, and its first ``parallel`` trials queued. Every check of a job applies to the
    first trials, whose refusal refuses the sweep."""
    dataset = dataset_version.dataset
    if dataset.team_id != team.pk:
        raise ValidationError(_("No such dataset version."))
    kind = dataset.task_kind
    if kind not in HEADS:
        raise ValidationError(
            _("Hyperparameter search trains classification, text-pair and NER models only.")
        )
    if not dataset_version.split_counts.get("dev"):
        raise ValidationError(
            _("%(v)s has no dev split: trials are compared on their dev metric.")
            % {"v": dataset_version}
        )
    if metric not in DEV_METRICS:
        raise ValidationError(
            _("The dev metric is one of %(all)s.") % {"all": ", ".join(DEV_METRICS)}
        )
    if not 2 <= n_trials <= MAX_TRIALS:
        raise ValidationError(_("A sweep has 2 to %(n)d trials.") % {"n": MAX_TRIALS})
    most = min(n_trials, settings.TRAINING_MAX_CONCURRENT_PER_USER)
    if not 1 <= parallel <= most:
        raise ValidationError(
            _(
                "Trials in parallel: 1 to %(n)d (the trials, and the jobs a user may have "
                "queued or running, TRAINING_MAX_CONCURRENT_PER_USER)."
            )
            % {"n": most}
        )
    if base_model and preset:
        raise ValidationError(_("Choose a base model or a preset, not both."))
    if not base_model:
        preset = preset or default_preset(kind, backend, accelerated=device_type != "cpu")
    space = checked_space(kind, None if base_model else preset, space)
    fixed = {k: v for k, v in (hyperparameters or {}).items() if k not in space and k != "metric"}
    with transaction.atomic():
        sweep = Sweep.objects.create(
            team=team,
            name=name.strip()[:100] or f"{dataset.name} v{dataset_version.number} sweep",
            dataset_version=dataset_version,
            backend=backend,
            base_model=base_model,
            preset="" if base_model else preset,
            device_type=device_type,
            n_trials=n_trials,
            parallel=parallel,
            space=space,
            hyperparameters=fixed,
            metric=metric,
            seed=seed,
            created_by=actor,
        )
        audit_record(
            action="training.sweep_create",
            actor=actor,
            team=team,
            target=sweep,
            data={"trials": n_trials, "parallel": parallel, "space": space, "metric": metric},
        )
        # The first trials' refusal (a base model not imported, a device nobody has, the
        # user's limit) refuses the sweep: nothing is written.
        _fill(sweep, list(sweep.trials.all()), strict=True)
    sweep.refresh_from_db()
    return sweep


def _trial_submit(sweep: Sweep, trials: list[TrainingJob]) -> TrainingJob:
    """The next trial: its hyperparameters asked of the study, queued as a job."""
    number = len(trials)
    dists = distributions(sweep.space)
    study = build_study(sweep, trials, seed_offset=number)
    if number == 0:
        defaults = _defaults_in_space(sweep, sweep.dataset_version.dataset.task_kind)
        if defaults:
            study.enqueue_trial(defaults)
    params = study.ask(dists).params
    job = training_job_submit(
        actor=sweep.created_by,
        team=sweep.team,
        dataset_version=sweep.dataset_version,
        backend=sweep.backend,
        base_model=sweep.base_model,
        preset=sweep.preset,
        hyperparameters={**sweep.hyperparameters, **params, "metric": sweep.metric},
        device_type=sweep.device_type,
        name=f"{sweep.name} · #{number}",
    )
    TrainingJob.objects.filter(pk=job.pk).update(sweep=sweep, trial_number=number)
    job.sweep, job.trial_number = sweep, number
    trials.append(job)
    return job


def _fill(sweep: Sweep, trials: list[TrainingJob], strict: bool) -> None:
    """Queue trials up to ``parallel`` at once and ``n_trials`` in all. A refused trial fails
    the sweep if none of its trials is left to end (else the next end tries again)."""
    active = sum(t.is_active for t in trials)
    for _n in range(min(sweep.parallel - active, sweep.n_trials - len(trials))):
        try:
            _trial_submit(sweep, trials)
        except (ValidationError, PermissionDenied) as exc:
            if strict:
                raise
            message = " ".join(getattr(exc, "messages", None) or [str(exc)])
            sweep.error = _("Trial %(n)d could not be queued: %(e)s") % {
                "n": len(trials),
                "e": message,
            }
            sweep.save(update_fields=["error"])
            if not any(t.is_active for t in trials):
                _finish(sweep, trials, Sweep.Status.FAILED)
            return


def _locked(sweep_id: int) -> Sweep | None:
    """The sweep, locked for this transaction: written first, so that SQLite takes its write
    lock here (two trials ending at once must not both queue the next one)."""
    Sweep.objects.filter(pk=sweep_id).update(seed=F("seed"))
    return Sweep.objects.select_for_update().filter(pk=sweep_id).first()


@transaction.atomic
def sweep_advance(sweep_id: int) -> Sweep | None:
    """After a trial's end (and on beat's round): queue the next trials; once every trial has
    ended, keep the best one's model version and delete the others'."""
    sweep = _locked(sweep_id)
    if sweep is None:
        return None
    trials = list(sweep.trials.select_related("model_version").order_by("trial_number", "id"))
    if not sweep.is_active:
        _discard_others(sweep, trials)  # a trial that registered its model after the end
        return sweep
    _fill(sweep, trials, strict=False)
    if sweep.is_active and len(trials) >= sweep.n_trials and not any(t.is_active for t in trials):
        _finish(sweep, trials, Sweep.Status.SUCCEEDED)
    return sweep


def _version_of(job: TrainingJob) -> ModelVersion | None:
    return ModelVersion.objects.filter(job=job).first()


def _finish(sweep: Sweep, trials: list[TrainingJob], status: str) -> None:
    """The sweep's end: the best trial (highest dev metric of its best checkpoint) keeps its
    model version, the others' are deleted with their files."""
    figures = trial_figures(trials, sweep.metric)
    registered = set(ModelVersion.objects.filter(job__in=trials).values_list("job_id", flat=True))
    scored = [
        (value, -job.trial_number, job)
        for job in trials
        if job.pk in registered and (value := figures[job.pk][1]) is not None
    ]
    if scored:
        _value, _number, best = max(scored, key=lambda s: (s[0], s[1]))
        sweep.best_job, sweep.best_model_version = best, _version_of(best)
    elif status == Sweep.Status.SUCCEEDED:
        status = Sweep.Status.FAILED
        sweep.error = sweep.error or _("No trial succeeded: see the trials' errors.")
    sweep.status = status
    sweep.finished_at = timezone.now()
    sweep.save(update_fields=["status", "error", "best_job", "best_model_version", "finished_at"])
    audit_record(
        action=f"training.sweep_{status}",
        actor=None,
        actor_username="system",
        team=sweep.team,
        target=sweep,
        data={"best_job": sweep.best_job_id, "model_version": sweep.best_model_version_id},
    )
    _discard_others(sweep, trials)


def _discard_others(sweep: Sweep, trials: list[TrainingJob]) -> None:
    """Delete the model versions of the trials that are not the best (one that serves an
    endpoint is kept: its deletion is refused, and the sweep says so)."""
    for job in trials:
        if job.pk == sweep.best_job_id:
            continue
        version = _version_of(job)
        if version is None:
            continue
        try:
            model_version_delete(actor=sweep.created_by, version=version)
        except ValidationError as exc:
            sweep.error = f"{sweep.error}\n{version}: {' '.join(exc.messages)}".strip()
            sweep.save(update_fields=["error"])


@transaction.atomic
def sweep_cancel(*, actor: AbstractBaseUser, sweep: Sweep) -> Sweep:
    """Stop the search: its queued and running trials are cancelled; the best trial that has
    finished keeps its model version."""
    sweep = _locked(sweep.pk)
    if not sweep.is_active:
        raise ValidationError(
            _("The search is %(status)s already; there is nothing to cancel.")
            % {"status": sweep.get_status_display()}
        )
    for job in sweep.trials.filter(status__in=TrainingJob.ACTIVE):
        training_job_cancel(actor=actor, job=job)
    audit_record(action="training.sweep_cancel", actor=actor, team=sweep.team, target=sweep)
    trials = list(sweep.trials.order_by("trial_number", "id"))
    _finish(sweep, trials, Sweep.Status.CANCELLED)
    return sweep


def trial_should_prune(job: TrainingJob) -> bool:
    """Whether a running trial's dev metric so far is below the median of the finished trials'
    at the same epoch (Optuna's median pruner, asked about the trial as it stands)."""
    sweep = job.sweep
    if sweep is None or not sweep.is_active or not job.is_active:
        return False
    curve = dev_curve(job, sweep.metric)
    if not curve:
        return False
    others = list(sweep.trials.exclude(pk=job.pk))
    study = build_study(sweep, others)
    dists = distributions(sweep.space)
    try:
        running = create_trial(
            state=TrialState.RUNNING,
            params={name: job.hyperparameters.get(name) for name in dists},
            distributions=dists,
            intermediate_values=curve,
        )
    except ValueError:
        return False
    return study.pruner.prune(study, running)


def sweep_trial_reported(job_id: int) -> bool:
    """A trial reported a dev metric (the supervisor calls this): pruned if it does badly, by
    the cancel path of any job, and marked so. True if it was pruned."""
    job = TrainingJob.objects.select_related("sweep").filter(pk=job_id).first()
    if job is None or job.sweep_id is None or not trial_should_prune(job):
        return False
    with transaction.atomic():
        marked = TrainingJob.objects.filter(
            pk=job.pk, status=TrainingJob.Status.RUNNING, cancel_requested=False
        ).update(pruned=True)
        if not marked:
            return False
        curve = dev_curve(job, job.sweep.metric)
        epoch = max(curve)
        TrainingEvent.objects.create(
            job=job,
            kind="log",
            attempt=job.attempts,
            data={
                "message": f"pruned by the hyperparameter search: {job.sweep.metric} "
                f"{curve[epoch]:.4f} at epoch {epoch} is below the median of the finished trials"
            },
        )
        training_job_cancel(actor=None, job=job)
    return True


def sweeps_reconcile() -> None:
    """Beat: advance every running sweep (a trial's end whose message was lost)."""
    for sweep_id in Sweep.objects.filter(status=Sweep.Status.RUNNING).values_list("pk", flat=True):
        sweep_advance(sweep_id)


def sweep_trials(sweep: Sweep) -> list[dict]:
    """Each trial as the sweep page and the API show it: number, job, status, pruned, the
    hyperparameters searched, the dev metric, its model version, whether it is the best."""
    rows = []
    trials = list(sweep.trials.select_related("model_version").order_by("trial_number", "id"))
    figures = trial_figures(trials, sweep.metric)
    for job in trials:
        version = getattr(job, "model_version", None)
        curve, value = figures[job.pk]
        rows.append(
            {
                "number": job.trial_number,
                "job": job,
                "job_id": job.pk,
                "status": job.status,
                "pruned": job.pruned,
                "params": {name: job.hyperparameters.get(name) for name in sweep.space},
                "shown": {
                    name: f"{v:.4g}" if isinstance(v := job.hyperparameters.get(name), float) else v
                    for name in sweep.space
                },
                # A running (or pruned) trial's best so far.
                "value": value if value is not None else max(curve.values(), default=None),
                "epochs_reported": len(curve),
                "model_version_id": version.pk if version else None,
                "best": job.pk == sweep.best_job_id,
            }
        )
    return rows
