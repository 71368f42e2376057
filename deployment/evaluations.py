"""A deployed endpoint scored on an evaluation set through its own API (issue #22): what its
applications get, canary and adapter included, rather than a version's files. Every question
goes to the endpoint as a chat (greedy, a few at a time, as applications call it); multiple
choice is scored by the first option letter each answer writes, open questions by exact
match, ROUGE-L and BLEU, with ``runtime.llm_eval``'s prompts and scoring, as an evaluate job
scores a version. An endpoint gives no log-likelihoods: its figures have no
``accuracy_loglik``. The result is a ``ModelEvaluation`` of the version that served the most
traffic, ranked on the set's leaderboard beside the versions' own; queued on Celery's default
queue (``tasks.evaluate_endpoint``). The answers so far are kept every ``CHECKPOINT_EVERY``
questions: a run whose worker died comes back asking only the questions after them."""

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from console.models import Team
from console.services import audit_record
from deployment.hosts import CONCURRENT, HostError, HostRefused, endpoint_chat_complete
from deployment.models import Endpoint, Revision
from labeling.models import DatasetVersion
from runtime import llm_eval
from runtime.kinds import GENERATIVE_KINDS
from training.evaluations import MISTAKES, evaluation_checks, wrong_answer
from training.models import ModelEvaluation, ModelVersion

# Questions one run sends (each a request to the endpoint, on the default queue's worker):
# a larger set is scored as a version, by an evaluate job on a train worker.
MAX_QUESTIONS = 2000
CHOICE_TOKENS = 8  # a multiple-choice answer's tokens, as an evaluate job writes them
CHECKPOINT_EVERY = 20  # answers between two checkpoints (and progress updates)


def _served(endpoint: Endpoint, adapter: str) -> tuple[ModelVersion, list[dict]]:
    """The version that answers the most of the endpoint's traffic (with ``adapter``: that
    adapter's version), and every active revision's version with its share."""
    revisions = list(
        endpoint.revisions.filter(status=Revision.Status.ACTIVE)
        .select_related("model_version")
        .order_by("-weight", "number")
    )
    if not revisions:
        raise ValidationError(_("%(e)s serves no model version.") % {"e": endpoint})
    shares = [
        {"version": r.model_version_id, "name": str(r.model_version), "weight": r.weight}
        for r in revisions
    ]
    if adapter:
        found = endpoint.adapters.filter(name=adapter).select_related("model_version").first()
        if found is None:
            raise ValidationError(
                _("%(e)s has no adapter named %(a)s.") % {"e": endpoint, "a": adapter}
            )
        return found.model_version, shares
    return revisions[0].model_version, shares


@transaction.atomic
def endpoint_evaluation_start(
    *,
    actor: AbstractBaseUser,
    team: Team,
    endpoint: Endpoint,
    dataset_version: DatasetVersion,
    adapter: str = "",
    max_new_tokens: int = 64,
) -> ModelEvaluation:
    """Queue the scoring of ``endpoint`` (its ``adapter``, if named) on every question of
    ``dataset_version``; answers of at most ``max_new_tokens`` (the endpoint's cap applies)."""
    from deployment import tasks

    if endpoint.team_id != team.pk or dataset_version.dataset.team_id != team.pk:
        raise ValidationError(_("That endpoint or evaluation set belongs to another team."))
    evaluation_checks(
        large=endpoint.task_kind in GENERATIVE_KINDS,
        scored=endpoint,
        dataset_version=dataset_version,
        max_new_tokens=max_new_tokens,
    )
    if dataset_version.row_count > MAX_QUESTIONS:
        raise ValidationError(
            _(
                "%(d)s has %(n)d questions; an endpoint is scored on at most %(max)d. "
                "Evaluate its model version instead (a job on a train worker)."
            )
            % {"d": dataset_version, "n": dataset_version.row_count, "max": MAX_QUESTIONS}
        )
    version, shares = _served(endpoint, adapter)
    evaluation = ModelEvaluation.objects.create(
        team=team,
        model_version=version,
        dataset_version=dataset_version,
        status=ModelEvaluation.Status.QUEUED,
        endpoint={
            "id": endpoint.pk,
            "name": endpoint.name,
            "adapter": adapter,
            "revisions": shares,
            "max_new_tokens": max_new_tokens,
            "queued_at": timezone.now().isoformat(),
        },
        created_by=actor,
    )
    audit_record(
        action="deployment.endpoint_evaluate",
        actor=actor,
        team=team,
        target=endpoint,
        data={"evaluation": evaluation.pk, "adapter": adapter, "set": str(dataset_version)},
    )
    transaction.on_commit(lambda: tasks.evaluate_endpoint.delay(evaluation.pk))
    return evaluation


def _questions(dataset_version: DatasetVersion) -> list[dict]:
    with default_storage.open(dataset_version.data_file, "rb") as f:
        return llm_eval.questions(json.loads(line) for line in f if line.strip())


def _update(evaluation: ModelEvaluation, **fields) -> None:
    ModelEvaluation.objects.filter(pk=evaluation.pk).update(**fields)
    for name, value in fields.items():
        setattr(evaluation, name, value)


def _checkpoint(evaluation: ModelEvaluation, info: dict, items: list[dict]) -> None:
    """Keep the answers so far (one file, replaced) and say how many there are."""
    name = info.get("checkpoint") or f"evaluations/partial-{uuid.uuid4().hex}.json"
    default_storage.delete(name)  # a worker killed before the save loses only this checkpoint
    info["checkpoint"] = default_storage.save(name, ContentFile(json.dumps(items).encode()))
    info["done"] = len(items)
    _update(evaluation, endpoint=dict(info))


def _end(evaluation: ModelEvaluation, info: dict, **fields) -> None:
    """The run's last update; its checkpoint is no longer needed."""
    if info.get("checkpoint"):
        default_storage.delete(info.pop("checkpoint"))
    info.pop("seconds", None)
    _update(evaluation, endpoint=info, **fields)


def _answered(info: dict, rows: list[dict]) -> list[dict]:
    """The answers an earlier run of this evaluation kept, where they still are and are of
    these questions, in order; else none (the run starts over)."""
    name = info.get("checkpoint")
    if not name:
        return []
    try:
        with default_storage.open(name, "rb") as f:
            items = json.load(f)
    except (OSError, ValueError):
        return []
    if not isinstance(items, list) or len(items) > len(rows):
        return []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or item.get("row") != i + 1:
            return []
        if item.get("question") != rows[i]["question"]:
            return []
    return items


def endpoint_evaluation_run(evaluation_id: int) -> ModelEvaluation | None:
    """Score the endpoint (the task's body): every question asked, scored, the figures kept.
    A question the endpoint refuses (longer than its model's context…) is scored wrong and
    keeps the reason; the endpoint unreachable or deleted fails the evaluation with it."""
    # Running: its worker died mid-run and the task came back (it is acknowledged late).
    evaluation = ModelEvaluation.objects.filter(
        pk=evaluation_id,
        status__in=[ModelEvaluation.Status.QUEUED, ModelEvaluation.Status.RUNNING],
    ).first()
    if evaluation is None:
        return None
    info = dict(evaluation.endpoint)
    _update(evaluation, status=ModelEvaluation.Status.RUNNING)
    started, spent = time.perf_counter(), info.get("seconds", 0.0)  # an earlier run's time
    try:
        endpoint = Endpoint.objects.filter(pk=info["id"], team_id=evaluation.team_id).first()
        if endpoint is None:
            raise HostError(_("The endpoint was deleted."))
        rows = _questions(evaluation.dataset_version)
        if not rows:
            raise ValueError(
                _("The evaluation set has no question with its answer or a reference.")
            )
        info["total"] = len(rows)

        def ask(row: dict) -> tuple[str, str]:
            """The endpoint's answer, or none and why it refused this question."""
            choice = llm_eval.is_choice(row)
            prompt = llm_eval.choice_prompt(row) if choice else llm_eval.open_prompt(row)
            try:
                return endpoint_chat_complete(
                    endpoint=endpoint,
                    messages=prompt,
                    max_tokens=CHOICE_TOKENS if choice else info["max_new_tokens"],
                    adapter=info["adapter"],
                ), ""
            except HostRefused as exc:  # scored as a wrong answer, with the reason
                return "", str(exc)[:500]

        items = _answered(info, rows)
        info["refused"] = sum("error" in x for x in items)
        with ThreadPoolExecutor(CONCURRENT) as pool:
            for i, (answer, refused) in enumerate(pool.map(ask, rows[len(items) :]), len(items)):
                row = rows[i]
                if llm_eval.is_choice(row):
                    items.append(llm_eval.choice_item(i, row, answer))
                else:
                    items.append(llm_eval.open_item(i, row, answer))
                if refused:
                    items[-1]["error"] = refused
                    info["refused"] += 1
                if (i + 1) % CHECKPOINT_EVERY == 0:
                    info["seconds"] = spent + time.perf_counter() - started
                    _checkpoint(evaluation, info, items)
    except (HostError, OSError, ValueError) as exc:
        info["error"] = str(exc)[:2000]
        _end(evaluation, info, status=ModelEvaluation.Status.FAILED)
        return evaluation
    except BaseException:
        info["error"] = _("The evaluation stopped on an internal error; the log has it.")
        _end(evaluation, info, status=ModelEvaluation.Status.FAILED)
        raise
    if info["refused"] == len(items):
        info["error"] = _("The endpoint refused every question: %(e)s") % {"e": items[0]["error"]}
        _end(evaluation, info, status=ModelEvaluation.Status.FAILED)
        return evaluation
    result = llm_eval.summarise(items)
    name = default_storage.save(
        f"evaluations/{uuid.uuid4().hex}.json",
        ContentFile(json.dumps(items, ensure_ascii=False).encode("utf-8")),
    )
    info.update(done=len(items), finished_at=timezone.now().isoformat())
    _end(
        evaluation,
        info,
        status=ModelEvaluation.Status.DONE,
        metrics=result["metrics"],
        subjects=result["subjects"],
        items_file=name,
        mistakes=[x for x in items if wrong_answer(x)][:MISTAKES],
        seconds=round(spent + time.perf_counter() - started, 1),
    )
    return evaluation
