"""Reads of the training app, shared by console views and the API; all scoped to a team."""

import statistics
from collections.abc import Iterator

from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet, Sum
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.utils.translation import gettext as _

from console.models import Team
from labeling.models import DatasetVersion
from runtime.kinds import TaskKind
from runtime.presets import LLM_PRESETS, PRESETS
from training.models import (
    BaseModel,
    ModelEvaluation,
    ModelVersion,
    Sweep,
    TrainingEvent,
    TrainingJob,
)


def team_base_models(team: Team) -> QuerySet[BaseModel]:
    """The team's own base models and those shared with every team of the site."""
    return BaseModel.objects.filter(Q(team=team) | Q(team__isnull=True)).order_by("name")


def base_model_get(team: Team, model_id: int) -> BaseModel:
    model = team_base_models(team).filter(pk=model_id).first()
    if model is None:
        raise Http404("No such base model.")
    return model


def team_jobs(team: Team) -> QuerySet[TrainingJob]:
    return TrainingJob.objects.filter(team=team).select_related(
        "dataset_version__dataset", "base_model", "created_by", "model_version", "pretrained_model"
    )


def job_get(team: Team, job_id: int) -> TrainingJob:
    job = team_jobs(team).filter(pk=job_id).first()
    if job is None:
        raise Http404("No such training job.")
    return job


def job_events(job: TrainingJob, after: int = 0, limit: int = 2000) -> list[TrainingEvent]:
    return list(job.events.filter(id__gt=after).order_by("id")[:limit])


LOG_KINDS = ("log", "error", "resumed")


def job_log_tail(job: TrainingJob, lines: int = 200) -> list[TrainingEvent]:
    """The log panel's last lines: the frameworks' chatter left out (training.output)."""
    tail = (
        job.events.filter(kind__in=LOG_KINDS).exclude(data__has_key="noise").order_by("-id")[:lines]
    )
    return list(reversed(tail))


def job_log(job: TrainingJob) -> Iterator[TrainingEvent]:
    """Every line of the job's log, every attempt's, the frameworks' chatter with them."""
    return job.events.filter(kind__in=LOG_KINDS).order_by("id").iterator(chunk_size=2000)


def team_model_versions(team: Team) -> QuerySet[ModelVersion]:
    return ModelVersion.objects.filter(team=team).select_related("dataset_version__dataset", "job")


def model_version_get(team: Team, version_id: int) -> ModelVersion:
    version = team_model_versions(team).filter(pk=version_id).first()
    if version is None:
        raise Http404("No such model version.")
    return version


def model_versions_get(team: Team, ids: list[int]) -> list[ModelVersion]:
    found = {v.pk: v for v in team_model_versions(team).filter(pk__in=ids)}
    missing = [i for i in ids if i not in found]
    if missing:
        raise Http404(f"No model version {missing[0]} in this team.")
    return [found[i] for i in dict.fromkeys(ids)]


def team_base_model_bytes(team: Team) -> int:
    """What the team's own base models take in storage (console.quotas; shared ones are the
    site's)."""
    return BaseModel.objects.filter(team=team).aggregate(n=Sum("stored_bytes"))["n"] or 0


def team_model_version_bytes(team: Team) -> int:
    """What the team's model versions take in storage (console.quotas)."""
    return ModelVersion.objects.filter(team=team).aggregate(n=Sum("stored_bytes"))["n"] or 0


def base_model_named(team: Team, name: str, backend: str) -> BaseModel:
    """The team's own base model of this name for ``backend``, else the site's shared one of that
    name (the team's always wins, on every database: two queries, not an order of NULLs); an
    error that lists what is imported otherwise."""
    candidates = team_base_models(team).filter(backend=backend)
    found = (
        candidates.filter(name=name, team=team).first()
        or candidates.filter(name=name, team__isnull=True).first()
    )
    if found is None:
        names = ", ".join(candidates.values_list("name", flat=True)) or _("none")
        raise ValidationError(
            _(
                "No base model named “%(name)s” is imported for the %(backend)s backend. "
                "Imported: %(names)s. Presets: %(presets)s."
            )
            % {
                "name": name,
                "backend": backend,
                "names": names,
                "presets": ", ".join([*PRESETS, *LLM_PRESETS]),
            }
        )
    return found


def team_sweeps(team: Team) -> QuerySet[Sweep]:
    return Sweep.objects.filter(team=team).select_related(
        "dataset_version__dataset", "best_model_version", "created_by"
    )


def sweep_get(team: Team, sweep_id: int) -> Sweep:
    sweep = team_sweeps(team).filter(pk=sweep_id).first()
    if sweep is None:
        raise Http404("No such hyperparameter search.")
    return sweep


def team_evaluation_sets(team: Team) -> QuerySet[DatasetVersion]:
    """The team's evaluation sets (dataset versions of the kind ``evaluation``), newest first."""
    return (
        DatasetVersion.objects.filter(dataset__team=team, dataset__task_kind=TaskKind.EVALUATION)
        .select_related("dataset")
        .order_by("-created_at")
    )


def evaluation_set_get(team: Team, dataset_version_id) -> DatasetVersion:
    found = None
    if str(dataset_version_id).isdigit() and len(str(dataset_version_id)) <= 18:
        found = team_evaluation_sets(team).filter(pk=int(dataset_version_id)).first()
    if found is None:
        raise Http404("No such evaluation set.")
    return found


def version_evaluations(version: ModelVersion) -> QuerySet[ModelEvaluation]:
    return version.model_evaluations.select_related("dataset_version__dataset").order_by(
        "-created_at"
    )


def model_evaluation_get(team: Team, evaluation_id: int) -> ModelEvaluation:
    return get_object_or_404(
        ModelEvaluation.objects.filter(team=team).select_related(
            "model_version", "dataset_version__dataset"
        ),
        pk=evaluation_id,
    )


ESTIMATE_FROM = 5  # recent finished jobs an estimate is made from


def duration_estimate(
    *, preset: str, base_model_id: int | None, device_type: str, rows: int, epochs: int
) -> dict | None:
    """How long a job of ``epochs`` over ``rows`` training rows takes, from the last jobs of
    the same model on the same device type that succeeded on this site: their start-up, and
    their seconds per training row and epoch (evaluation included). None without such jobs.
    Only times are read: nothing of another team's job shows."""
    same = Q(base_model_id=base_model_id) if base_model_id else Q(preset=preset, base_model=None)
    done = (
        TrainingJob.objects.filter(
            same,
            status=TrainingJob.Status.SUCCEEDED,
            device_type=device_type,
            started_at__isnull=False,
            first_step_at__isnull=False,
            finished_at__isnull=False,
            epoch__gt=0,
        )
        .order_by("-finished_at")
        .values_list(
            "started_at", "first_step_at", "finished_at", "epoch", "dataset_version__split_counts"
        )[:ESTIMATE_FROM]
    )
    startup, per_row = [], []
    for started, first_step, finished, ran, splits in done:
        trained = (splits or {}).get("train") or 0
        if trained:
            startup.append((first_step - started).total_seconds())
            per_row.append((finished - first_step).total_seconds() / (trained * ran))
    if not per_row:
        return None
    seconds = statistics.median(startup) + rows * epochs * statistics.median(per_row)
    return {"seconds": max(1, round(seconds)), "jobs": len(per_row)}


def job_curves(
    jobs: list[TrainingJob], points: int
) -> dict[int, tuple[list[list[float]], dict[str, list[list[float]]]]]:
    """Per job (by id), in one query: its training loss by step, thinned evenly to ``points``
    at most (the last kept), and each dev metric by epoch. A later attempt's figure replaces
    an earlier one's of the same step or epoch."""
    loss: dict[int, dict[int, float]] = {job.pk: {} for job in jobs}
    dev: dict[int, dict[str, dict[int, float]]] = {job.pk: {} for job in jobs}
    events = TrainingEvent.objects.filter(job__in=jobs, kind__in=("loss", "metrics"))
    for job_id, kind, data in events.order_by("id").values_list("job_id", "kind", "data"):
        if kind == "loss" and isinstance(data.get("loss"), int | float):
            loss[job_id][int(data.get("step") or 0)] = float(data["loss"])
        elif kind == "metrics" and data.get("split") == "dev" and data.get("epoch") is not None:
            for name, value in (data.get("metrics") or {}).items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    dev[job_id].setdefault(name, {})[int(data["epoch"])] = float(value)
    curves = {}
    for job in jobs:
        steps = sorted(loss[job.pk].items())
        if len(steps) > points:
            stride = len(steps) / points
            steps = [steps[int(i * stride)] for i in range(points - 1)] + [steps[-1]]
        curves[job.pk] = (
            [[step, value] for step, value in steps],
            {name: sorted([e, v] for e, v in by.items()) for name, by in dev[job.pk].items()},
        )
    return curves
