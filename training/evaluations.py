"""Large models scored on evaluation sets (issue #22): an evaluate job runs a model version on
every question of a dataset version of the kind ``evaluation`` (``runtime.llm_eval``: multiple
choice by log-likelihood and by generation, open questions by exact match, ROUGE-L and BLEU),
queued on a train worker like any job (progress, cancel, retry from the version's page). Its
result is a ``ModelEvaluation``; the set's leaderboard ranks every version scored on it."""

import json
import uuid
from dataclasses import asdict
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction
from django.utils.translation import gettext as _

from console.hardware import profiles
from console.models import Team
from console.selectors import live_nodes_with
from console.services import audit_record
from labeling.models import DatasetVersion
from runtime.generation import RUNTIMES as GENERATIVE_RUNTIMES
from runtime.kinds import TaskKind
from runtime.spec import Hyperparameters
from training.jobs import no_node_reason, training_job_enqueue, training_job_finish
from training.models import ModelEvaluation, ModelVersion, TrainingJob

MAX_NEW_TOKENS = 1024
# What the platform reads of a runner's evaluation.json (the runner is another user's process).
MAX_EVALUATION_BYTES = 64 << 20
MISTAKES = 50  # wrong answers kept on the evaluation's page
# The figures a leaderboard ranks by, the first a set has (multiple choice: accuracy).
RANKED_BY = ("accuracy_loglik", "accuracy_generation", "exact_match", "rouge_l", "bleu")
# judge_score: the mean of a judge endpoint's 1–5 scores of the open questions (deployment.judge).
FIGURES = (*RANKED_BY, "judge_score")


def evaluation_checks(
    *, large: bool, scored: object, dataset_version: DatasetVersion, max_new_tokens: int
) -> None:
    """Why ``scored`` (a model version or an endpoint; ``large``: a causal LM) cannot be
    scored on ``dataset_version`` with answers of ``max_new_tokens``, as a ValidationError."""
    if not large:
        raise ValidationError(
            _("%(m)s is not a large model: only large models are scored on evaluation sets.")
            % {"m": scored}
        )
    if dataset_version.dataset.task_kind != TaskKind.EVALUATION:
        raise ValidationError(
            _("%(d)s is not an evaluation set (task kind: evaluation).") % {"d": dataset_version}
        )
    if not dataset_version.row_count:
        raise ValidationError(_("%(d)s has no questions.") % {"d": dataset_version})
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValidationError(_("New tokens must be between 1 and %(n)d.") % {"n": MAX_NEW_TOKENS})


@transaction.atomic
def evaluation_submit(
    *,
    actor: AbstractBaseUser,
    team: Team,
    model_version: ModelVersion,
    dataset_version: DatasetVersion,
    max_new_tokens: int = 64,
    device_type: str = "cpu",
) -> TrainingJob:
    """Queue an evaluate job: ``model_version`` scored on every question of
    ``dataset_version``, answers of at most ``max_new_tokens``."""
    if model_version.team_id != team.pk or dataset_version.dataset.team_id != team.pk:
        raise ValidationError(_("That model version or evaluation set belongs to another team."))
    evaluation_checks(
        large=model_version.runtime in GENERATIVE_RUNTIMES,
        scored=model_version,
        dataset_version=dataset_version,
        max_new_tokens=max_new_tokens,
    )
    if device_type not in profiles():
        raise ValidationError(_("Unknown device type %(d)s.") % {"d": device_type})
    hp = Hyperparameters(max_new_tokens=max_new_tokens, batch_size=8)
    job = TrainingJob.objects.create(
        team=team,
        name=f"{model_version} @ {dataset_version}"[:100],
        dataset_version=dataset_version,
        task_kind=TaskKind.EVALUATION,
        labels=[],
        backend=model_version.backend,
        objective=TrainingJob.Objective.EVALUATE,
        parent_version=model_version,
        hyperparameters=asdict(hp),
        device_type=device_type,
        device_count=1,
        waiting_reason="" if live_nodes_with(device_type) else no_node_reason(device_type),
        celery_task_id=uuid.uuid4().hex,
        created_by=actor,
    )
    audit_record(
        action="training.model_evaluate",
        actor=actor,
        team=team,
        target=job,
        data={"version": str(model_version), "evaluation_set": str(dataset_version)},
    )
    transaction.on_commit(lambda: training_job_enqueue(job))
    return job


def _numbers(value) -> dict:
    """The numeric figures of a runner's dict (what else it wrote is dropped)."""
    if not isinstance(value, dict):
        return {}
    return {
        str(k)[:64]: v
        for k, v in value.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def wrong_answer(item: dict) -> bool:
    """A question answered wrong: the likeliest option (the option written, where there are
    no likelihoods: an endpoint's), or an open answer that matches no reference."""
    if item.get("type") == "choice":
        chosen = item["choice_loglik"] if "choice_loglik" in item else item.get("choice_generation")
        return chosen != item.get("answer")
    return not item.get("exact_match")


def evaluation_register(job: TrainingJob, workdir: Path) -> ModelEvaluation:
    """A succeeded evaluate job's result: its figures, per subject, and every question's
    scores (stored as a file), read within bounds from what the runner wrote."""
    path = workdir / "evaluation.json"
    if path.stat().st_size > MAX_EVALUATION_BYTES:
        raise ValueError(_("evaluation.json is over %(n)d MB.") % {"n": MAX_EVALUATION_BYTES >> 20})
    evaluation = json.loads(path.read_text(encoding="utf-8"))
    items = evaluation.get("items")
    items = [x for x in items if isinstance(x, dict)] if isinstance(items, list) else []
    subjects = evaluation.get("subjects")
    subjects = (
        {str(k)[:100]: _numbers(v) for k, v in subjects.items()}
        if isinstance(subjects, dict)
        else {}
    )
    seconds = evaluation.get("seconds")
    name = default_storage.save(
        f"evaluations/{uuid.uuid4().hex}.json",
        ContentFile(json.dumps(items, ensure_ascii=False).encode("utf-8")),
    )
    with transaction.atomic():
        result = ModelEvaluation.objects.create(
            team=job.team,
            model_version=job.parent_version,
            dataset_version=job.dataset_version,
            job=job,
            metrics=_numbers(evaluation.get("metrics")),
            subjects=subjects,
            items_file=name,
            mistakes=[x for x in items if wrong_answer(x)][:MISTAKES],
            seconds=seconds if isinstance(seconds, int | float) else None,
            created_by=job.created_by,
        )
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        training_job_finish(job, TrainingJob.Status.SUCCEEDED)
    return result


def ranked_by(evaluations: list[ModelEvaluation]) -> str | None:
    """The figure a leaderboard ranks by: the first of RANKED_BY that all its evaluations have
    (an endpoint's has no log-likelihoods), else the first that any has."""
    for name in RANKED_BY:
        if evaluations and all(name in e.metrics for e in evaluations):
            return name
    for name in RANKED_BY:
        if any(name in e.metrics for e in evaluations):
            return name
    return None


def leaderboard(dataset_version: DatasetVersion) -> dict:
    """Every model version and endpoint scored on the set, best first (the latest score of
    each version, and of each endpoint and adapter), with the subjects as columns:
    ``{"ranked_by", "figures", "subjects", "rows"}``."""
    latest: dict[tuple, ModelEvaluation] = {}
    for e in (
        ModelEvaluation.objects.filter(
            dataset_version=dataset_version, status=ModelEvaluation.Status.DONE
        )
        .select_related("model_version")
        .order_by("created_at")
    ):
        latest[(e.model_version_id, e.endpoint.get("id"), e.endpoint.get("adapter"))] = e
    evaluations = list(latest.values())
    key = ranked_by(evaluations)
    # Best first; a tie goes to the other figures, then to the newer version.
    order = [key, *(f for f in RANKED_BY if f != key)] if key else []
    evaluations.sort(
        key=lambda e: (*(-(e.metrics.get(f) or 0.0) for f in order), -e.model_version_id)
    )
    subjects = sorted({s for e in evaluations for s in e.subjects})
    figures = [f for f in FIGURES if any(f in e.metrics for e in evaluations)]
    subject_figure = key
    return {
        "ranked_by": key,
        "figures": figures,
        "subjects": subjects,
        "rows": [
            {
                "rank": i + 1,
                "evaluation": e,
                "version": e.model_version,
                "scored": e.scored,
                "figures": [e.metrics.get(f) for f in figures],
                "subjects": [(e.subjects.get(s) or {}).get(subject_figure) for s in subjects],
            }
            for i, e in enumerate(evaluations)
        ],
    }


def leaderboard_table(board: dict) -> list[list[str]]:
    """The leaderboard as rows of cells (the CSV export): a header, then a row a version."""
    from labeling.exports import neutralise

    header = ["rank", "model_version", "endpoint", "evaluated_at"]
    rows = [header + board["figures"] + board["subjects"]]
    for row in board["rows"]:
        evaluation = row["evaluation"]
        cells = [str(row["rank"]), str(row["version"])]
        cells.append(evaluation.scored if evaluation.endpoint.get("name") else "")
        cells.append(evaluation.created_at.isoformat(timespec="seconds"))
        cells += ["" if v is None else f"{v:.4f}" for v in [*row["figures"], *row["subjects"]]]
        rows.append(cells)
    # A version's or a subject's name is the team's text: no cell starts a formula.
    return [[neutralise(c) for c in r] for r in rows]
