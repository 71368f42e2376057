"""Pre-annotation: a deployed model labels a labeling project's unlabeled tasks (or drafts the
responses of an instruction project), imported into Label Studio as predictions with scores,
least confident first. The one loop of the product, owned here: deployment calls labeling's
services, never the reverse."""

from concurrent.futures import ThreadPoolExecutor

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _

from console.services import audit_record
from deployment.hosts import HostError, endpoint_chat_complete, endpoint_predict
from deployment.models import Endpoint
from labeling import selectors as labeling_selectors
from labeling.models import LabelingProject
from labeling.projects import labeling_project_preannotate

# A draft's score: a chat endpoint gives no confidence, so every draft ranks alike.
DRAFT_SCORE = 0.5
DRAFT_MAX_TOKENS = 512


def _confidence(kind: str, out: dict) -> tuple[dict, float]:
    """A prediction as the labeling app takes it, and how sure the model is (0..1)."""
    if kind == "ner":
        entities = [{k: e[k] for k in ("start", "end", "label")} for e in out["entities"]]
        scores = [e["score"] for e in out["entities"]]
        return {"entities": entities}, min(scores) if scores else 0.5
    if kind == "multi_label":
        labels = out["labels"] or [out["scores"][0]["label"]]
        sure = [max(s["score"], 1 - s["score"]) for s in out["scores"]]
        return {"labels": labels}, min(sure)
    return {"label": out["label"]}, out["score"]


@transaction.atomic
def preannotate_start(
    *, actor: AbstractBaseUser, project: LabelingProject, endpoint: Endpoint
) -> None:
    """Queue the pre-annotation of the project's unlabeled tasks by ``endpoint``."""
    from deployment import tasks

    if endpoint.team_id != project.team_id:
        raise ValidationError(_("That endpoint belongs to another team."))
    kind = project.source_version.dataset.task_kind
    if endpoint.task_kind != kind:
        raise ValidationError(
            _("%(e)s serves %(k)s models; the project labels %(p)s.")
            % {"e": endpoint.name, "k": endpoint.task_kind, "p": kind}
        )
    if project.ls_project_id is None:
        raise ValidationError(_("The project is not in Label Studio yet."))
    if kind == "preference":
        raise ValidationError(
            _(
                "Pre-annotation drafts the responses of instruction projects; people compare "
                "the pairs of preference projects."
            )
        )
    audit_record(
        action="labeling_project.preannotate_start",
        actor=actor,
        team=project.team,
        target=project,
        data={"endpoint": endpoint.name},
    )
    transaction.on_commit(lambda: tasks.preannotate_labeling_project.delay(project.pk, endpoint.pk))


def _draft_responses(project: LabelingProject, endpoint: Endpoint, numbers, rows) -> int:
    """Drafts of the responses that nobody wrote yet, generated concurrently (the serving
    host batches them) and imported as predictions for annotators to correct."""
    from labeling.task_kinds.generative import prompt_turns

    revision = endpoint.stable_revision
    workers = max(1, min(32, revision.max_batch_size if revision else 8))
    done = 0
    for start in range(0, len(numbers), workers * 4):
        chunk = numbers[start : start + workers * 4]

        def draft(n: int) -> str:
            return endpoint_chat_complete(
                endpoint=endpoint,
                messages=prompt_turns(rows[n]["messages"]),
                max_tokens=DRAFT_MAX_TOKENS,
            )

        with ThreadPoolExecutor(workers) as pool:
            drafts = list(pool.map(draft, chunk))
        predictions = [
            {
                "row": n,
                "value": {
                    "messages": [
                        *prompt_turns(rows[n]["messages"]),
                        {"role": "assistant", "content": text},
                    ]
                },
                "score": DRAFT_SCORE,
            }
            for n, text in zip(chunk, drafts, strict=True)
            if text.strip()
        ]
        if predictions:
            done += labeling_project_preannotate(
                project=project, predictions=predictions, model_version=endpoint.name
            )
    return done


def preannotate_run(project_id: int, endpoint_id: int, batch_size: int | None = None) -> int:
    """Send the project's tasks that nobody labeled yet to the endpoint in batches and import
    the answers into Label Studio as predictions with scores (least confident served first);
    the number of predictions imported."""
    project = LabelingProject.objects.select_related("source_version__dataset", "team").get(
        pk=project_id
    )
    endpoint = Endpoint.objects.get(pk=endpoint_id, team=project.team)
    kind = project.source_version.dataset.task_kind
    labeled = set(project.annotations.values_list("task__row", flat=True))
    rows_wanted = sorted(set(project.tasks.values_list("row", flat=True)) - labeled)
    rows = labeling_selectors.rows_by_number(project.source_version, set(rows_wanted))
    if kind == "instruction":
        return _draft_responses(project, endpoint, rows_wanted, rows)
    size = batch_size or endpoint.max_inputs
    done = 0
    for start in range(0, len(rows_wanted), size):
        numbers = rows_wanted[start : start + size]
        inputs = [
            {"text_a": rows[n]["text_a"], "text_b": rows[n]["text_b"]}
            if kind == "text_pair"
            else rows[n]["text"]
            for n in numbers
        ]
        status, body = endpoint_predict(endpoint=endpoint, inputs=inputs, top_k=1)
        if status != 200:
            message = body.get("error", {}).get("message", "")
            raise HostError(f"{endpoint.name} answered {status}: {message}")
        predictions = []
        for n, out in zip(numbers, body["outputs"], strict=True):
            value, score = _confidence(kind, out)
            predictions.append({"row": n, "value": value, "score": round(score, 4)})
        done += labeling_project_preannotate(
            project=project,
            predictions=predictions,
            model_version=f"{endpoint.name}:{body.get('model', '')}",
        )
    return done
