"""A judge of an evaluation's open questions (issue #22): another generative endpoint of the team
reads each open question with its references and the model's answer through a rubric prompt,
and answers with a score from 1 to 5 and its reason. Every judgement is kept with the judge's
whole reply; the mean score is the evaluation's ``judge_score``, which its set's leaderboard
shows. Queued on Celery's default queue (``tasks.judge_model_evaluation``)."""

import json
import re
import uuid
from concurrent.futures import ThreadPoolExecutor

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from console.services import audit_record
from deployment.hosts import CONCURRENT, HostError, endpoint_chat_complete
from deployment.models import Endpoint
from runtime.kinds import GENERATIVE_KINDS
from training.evaluations import MAX_EVALUATION_BYTES
from training.models import ModelEvaluation

# The rubric's placeholders, each replaced by the row's text (never str.format: the rubric is
# the team's text, and a format string reaches into objects).
PLACEHOLDERS = ("{question}", "{reference}", "{answer}")
DEFAULT_RUBRIC = (
    "你是严格的评分员。请对照参考答案，评价回答的正确性与完整性，给出 1 到 5 的整数分数"
    "（5 分最好）。\n\n问题：{question}\n参考答案：{reference}\n回答：{answer}\n\n"
    "请严格按以下格式输出两行：\n分数：<1 到 5 的整数>\n理由：<一句话>"
)
MAX_RUBRIC = 4000  # characters
MAX_JUDGED = 500  # open questions a judge reads in one run
JUDGE_MAX_TOKENS = 256
SCORE = re.compile(r"(?:分数|评分|score)\s*[:：]\s*([1-5])\b", re.IGNORECASE)
REASON = re.compile(r"(?:理由|reason)\s*[:：]\s*(.+)", re.IGNORECASE | re.DOTALL)


def judge_endpoints(evaluation: ModelEvaluation):
    """The team's generative endpoints that may judge the evaluation."""
    return Endpoint.objects.filter(
        team_id=evaluation.team_id, task_kind__in=list(GENERATIVE_KINDS)
    ).order_by("name")


@transaction.atomic
def judge_start(
    *,
    actor: AbstractBaseUser,
    evaluation: ModelEvaluation,
    endpoint: Endpoint,
    rubric: str = DEFAULT_RUBRIC,
) -> ModelEvaluation:
    """Queue the judging of the evaluation's open questions by ``endpoint``."""
    from deployment import tasks

    evaluation = ModelEvaluation.objects.select_for_update().get(pk=evaluation.pk)
    if endpoint.team_id != evaluation.team_id:
        raise ValidationError(_("That endpoint belongs to another team."))
    if evaluation.status != ModelEvaluation.Status.DONE:
        raise ValidationError(_("The evaluation is not done yet: judge it once it is."))
    if endpoint.task_kind not in GENERATIVE_KINDS:
        raise ValidationError(_("%(e)s is not a large model: it cannot judge.") % {"e": endpoint})
    if not evaluation.metrics.get("open_rows"):
        raise ValidationError(_("The evaluation has no open questions to judge."))
    rubric = (rubric or "").strip()
    missing = [p for p in PLACEHOLDERS if p not in rubric]
    if missing or len(rubric) > MAX_RUBRIC:
        raise ValidationError(
            _("A rubric is at most %(n)d characters and holds %(p)s.")
            % {"n": MAX_RUBRIC, "p": ", ".join(PLACEHOLDERS)}
        )
    if evaluation.judge.get("status") in ("queued", "running"):
        raise ValidationError(_("A judge is at work on this evaluation already."))
    evaluation.judge = {
        "endpoint": endpoint.name,
        "endpoint_id": endpoint.pk,
        "rubric": rubric,
        "status": "queued",
        "queued_at": timezone.now().isoformat(),
    }
    evaluation.save(update_fields=["judge"])
    audit_record(
        action="training.evaluation_judge",
        actor=actor,
        team=evaluation.team,
        target=evaluation.model_version,
        data={"evaluation": evaluation.pk, "endpoint": endpoint.name},
    )
    transaction.on_commit(lambda: tasks.judge_model_evaluation.delay(evaluation.pk))
    return evaluation


def _prompt(rubric: str, item: dict) -> str:
    values = {
        "{question}": str(item.get("question") or ""),
        "{reference}": " / ".join(str(r) for r in item.get("references") or []),
        "{answer}": str(item.get("generated") or ""),
    }
    # One pass over the rubric: a row's text that holds "{answer}" is not replaced again.
    return re.sub("|".join(re.escape(p) for p in PLACEHOLDERS), lambda m: values[m[0]], rubric)


def judgement(reply: str) -> tuple[int | None, str]:
    """The score (1–5) and the reason a judge's reply gives; None where it gives no score."""
    score = SCORE.search(reply)
    reason = REASON.search(reply)
    return (int(score[1]) if score else None), (reason[1].strip()[:1000] if reason else "")


def judge_run(evaluation_id: int) -> dict:
    """Judge the evaluation's open questions (the task's body); the judge's figures."""
    evaluation = ModelEvaluation.objects.filter(pk=evaluation_id).first()
    if evaluation is None or evaluation.judge.get("status") not in ("queued", "running"):
        return {}
    judge = dict(evaluation.judge, status="running")
    _save(evaluation, judge)
    endpoint = Endpoint.objects.filter(
        pk=judge.get("endpoint_id"), team_id=evaluation.team_id
    ).first()
    try:
        if endpoint is None:
            raise HostError(_("The judge's endpoint was deleted."))
        with default_storage.open(evaluation.items_file, "rb") as f:
            items = json.loads(f.read(MAX_EVALUATION_BYTES + 1))
        open_ = [x for x in items if x.get("type") == "open"][:MAX_JUDGED]

        def ask(item: dict) -> str:
            return endpoint_chat_complete(
                endpoint=endpoint,
                messages=[{"role": "user", "content": _prompt(judge["rubric"], item)}],
                max_tokens=JUDGE_MAX_TOKENS,
            )

        judged = []
        # A few at a time, as the endpoint's callers do: it batches them.
        with ThreadPoolExecutor(CONCURRENT) as pool:
            for item, reply in zip(open_, pool.map(ask, open_), strict=True):
                score, reason = judgement(reply)
                row = item.get("row")
                judged.append({"row": row, "score": score, "reason": reason, "reply": reply})
    except (HostError, OSError, ValueError) as exc:
        judge.update(status="failed", error=str(exc)[:2000])
        _save(evaluation, judge)
        return judge
    scores = [j["score"] for j in judged if j["score"] is not None]
    name = default_storage.save(
        f"evaluations/judge-{uuid.uuid4().hex}.json",
        ContentFile(json.dumps(judged, ensure_ascii=False).encode("utf-8")),
    )
    judge.update(
        status="done",
        judged=len(judged),
        unscored=len(judged) - len(scores),
        score=round(sum(scores) / len(scores), 4) if scores else None,
        judgements_file=name,
        judgements=judged[:50],  # the first, on the evaluation's page
        finished_at=timezone.now().isoformat(),
    )
    with transaction.atomic():
        evaluation = ModelEvaluation.objects.select_for_update().get(pk=evaluation.pk)
        evaluation.judge = judge
        if judge["score"] is not None:
            evaluation.metrics = {**evaluation.metrics, "judge_score": judge["score"]}
        evaluation.save(update_fields=["judge", "metrics"])
    return judge


def _save(evaluation: ModelEvaluation, judge: dict) -> None:
    ModelEvaluation.objects.filter(pk=evaluation.pk).update(judge=judge)
    evaluation.judge = judge
