"""Labeling projects: created over a dataset version's rows, pushed to Label Studio as tasks (in
the team's organisation), their label set changed before the first annotation; the webhook Label
Studio calls; which annotations count (the team's members with a labeling role); and the
pre-annotation hook that the deployment app calls with a model's predictions."""

import hmac
import json
import random
import secrets
from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from console.models import hash_token
from console.services import audit_record
from labeling import pipeline, selectors, task_kinds
from labeling.datasets import clean_labels
from labeling.models import DatasetVersion, LabelingProject, LabelingTask, LabelStudioAccount
from labeling.task_kinds.base import RowError

PUSH_BATCH = 1000
# A push's retries while Label Studio is down (tasks.push_labeling_project's; Celery's
# exponential backoff, each wait at most the cap): about 35 minutes in all.
PUSH_RETRIES, PUSH_BACKOFF_S, PUSH_BACKOFF_MAX_S = 12, 5, 300
# A project still "creating" this long after its push was queued has lost that push: longer
# than every retry's wait, with an hour for the attempts themselves.
PUSH_WINDOW = timedelta(
    seconds=sum(min(PUSH_BACKOFF_S * 2**i, PUSH_BACKOFF_MAX_S) for i in range(PUSH_RETRIES))
) + timedelta(hours=1)


@transaction.atomic
def labeling_project_create(
    *,
    actor: AbstractBaseUser,
    version: DatasetVersion,
    name: str,
    labels: Iterable[str] = (),
    instructions: str = "",
    overlap: int = 1,
    selection: str = "all",
    sample_size: int | None = None,
    split: str = "",
    seed: int = 42,
) -> LabelingProject:
    """A labeling project over a version's rows; Label Studio's side is made by the push task."""
    dataset = version.dataset
    name = name.strip()
    if not name:
        raise ValidationError(_("A labeling project needs a name."))
    labels = (
        clean_labels(labels, dataset.task_kind)
        or list(dataset.labels)
        or list(version.stats.get("labels", {}))
    )
    if not labels and task_kinds.get(dataset.task_kind).takes_labels:
        raise ValidationError(_("Give the labels the annotators choose from."))
    if selection not in LabelingProject.Selection.values:
        raise ValidationError(_("Unknown row selection “%(s)s”.") % {"s": selection})
    if selection == LabelingProject.Selection.SAMPLE and not (sample_size and sample_size > 0):
        raise ValidationError(_("A sample needs its size."))
    if selection == LabelingProject.Selection.SPLIT and split not in pipeline.SPLITS:
        raise ValidationError(_("Choose the split: train, dev or test."))
    if not 1 <= overlap <= 10:
        raise ValidationError(_("Between 1 and 10 annotators per task."))
    project = LabelingProject.objects.create(
        team=dataset.team,
        source_version=version,
        name=name,
        labels=labels,
        instructions=instructions.strip(),
        overlap=overlap,
        selection=selection,
        sample_size=sample_size,
        split=split,
        seed=seed,
        created_by=actor,
        push_queued_at=timezone.now(),
    )
    audit_record(
        action="labeling_project.create",
        actor=actor,
        team=dataset.team,
        target=project,
        data={"version": version.number, "dataset": dataset.name, "selection": selection},
    )
    from labeling.tasks import push_labeling_project

    transaction.on_commit(lambda: push_labeling_project.delay(project.pk))
    return project


def _selected_rows(project: LabelingProject):
    """(row number, row) of the source version that the project labels, in order."""
    version = project.source_version
    schema = task_kinds.get(version.dataset.task_kind)
    chosen = None
    if project.selection == LabelingProject.Selection.SAMPLE:
        size = min(project.sample_size, version.row_count)
        rng = random.Random(project.seed)  # noqa: S311 - a reproducible sample, not a secret
        chosen = set(rng.sample(range(1, version.row_count + 1), size))
    with default_storage.open(version.data_file, "rb") as f:
        for number, line in enumerate(f, start=1):
            if chosen is not None and number not in chosen:
                continue
            row = json.loads(line)
            if (
                project.selection == LabelingProject.Selection.SPLIT
                and row["split"] != project.split
            ):
                continue
            if project.selection == LabelingProject.Selection.UNLABELED and schema.is_labeled(row):
                continue
            yield number, row


def labeling_project_push(project_id: int) -> LabelingProject:
    """Make the Label Studio project and push the selected rows as tasks, in batches; rows
    that are already there are skipped, so a push that failed half-way resumes."""
    from labeling.label_studio import client

    project = LabelingProject.objects.select_related("source_version__dataset", "team").get(
        pk=project_id
    )
    version = project.source_version
    schema = task_kinds.get(version.dataset.task_kind)
    ls = client(project.team)
    if project.ls_project_id is None:
        made = False
        with transaction.atomic():
            # One push at a time makes the Label Studio project (a retry may overlap one
            # still running): the other waits here, then finds the project made.
            project.ls_project_id = _locked(project).ls_project_id
            if project.ls_project_id is None:
                created = ls.projects.create(
                    # In the team's own organisation (the team's service account makes it).
                    title=f"{project.team.slug} · {project.name} #{project.pk}"[:50],
                    description=f"{version.dataset.name} v{version.number}",
                    label_config=schema.label_config(project.labels),
                    expert_instruction=project.instructions,
                    show_instruction=bool(project.instructions),
                    maximum_annotations=project.overlap,
                )
                LabelingProject.objects.filter(pk=project.pk).update(ls_project_id=created.id)
                project.ls_project_id, made = created.id, True
        if made:
            labeling_project_webhook_register(project)
    done = set(project.tasks.values_list("row", flat=True))
    model_version = f"{version.dataset.name} v{version.number}"
    batch: list[tuple[int, dict]] = []
    total = 0

    @transaction.atomic
    def flush() -> None:
        # Rows another push sent meanwhile are skipped: pushes send their batches in turn.
        _locked(project)
        rows = project.tasks.filter(row__in=[number for number, _row in batch])
        sent = set(rows.values_list("row", flat=True))
        batch[:] = [(number, row) for number, row in batch if number not in sent]
        tasks = []
        for number, row in batch:
            task = {"data": {**schema.ls_data(row), "platform_row": number}}
            result = schema.ls_result(row)
            if result:  # existing labels are for review, not ground truth
                task["predictions"] = [{"model_version": model_version, "result": result}]
            tasks.append(task)
        if tasks:
            response = ls.projects.import_tasks(
                id=project.ls_project_id, request=tasks, return_task_ids=True
            )
            LabelingTask.objects.bulk_create(
                LabelingTask(project=project, row=number, ls_task_id=task_id)
                for (number, _row), task_id in zip(batch, response.task_ids, strict=True)
            )
        LabelingProject.objects.filter(pk=project.pk).update(tasks_pushed=project.tasks.count())
        batch.clear()

    for number, row in _selected_rows(project):
        total += 1
        if number in done:
            continue
        batch.append((number, row))
        if len(batch) >= PUSH_BATCH:
            flush()
    if batch:
        flush()
    LabelingProject.objects.filter(pk=project.pk).update(
        status=LabelingProject.Status.READY, tasks_total=total, tasks_pushed=total, error=""
    )
    project.refresh_from_db()
    return project


def _locked(project: LabelingProject) -> LabelingProject:
    """The project's row, locked until the transaction ends (PostgreSQL; on SQLite this takes
    no lock: two pushes at the very same moment could still both make a project there)."""
    return LabelingProject.objects.select_for_update().only("ls_project_id").get(pk=project.pk)


def labeling_projects_push_again() -> list[int]:
    """Projects to push again, each claimed for one push: those whose push gave up (Label
    Studio was down too long), and those still "creating" long after their push was queued
    (its message lost, say with Redis). Claimed, their push counts as queued now, so that the
    next reconciliation does not start a second push while the first still retries."""
    now = timezone.now()
    due = Q(status=LabelingProject.Status.FAILED) | Q(
        Q(push_queued_at__lt=now - PUSH_WINDOW) | Q(push_queued_at=None),
        status=LabelingProject.Status.CREATING,
    )
    return [
        pk
        for pk in LabelingProject.objects.filter(due).values_list("pk", flat=True)
        if LabelingProject.objects.filter(due, pk=pk).update(
            status=LabelingProject.Status.CREATING, push_queued_at=now
        )
    ]


def labeling_project_problem(project_id: int, error: str, *, final: bool) -> None:
    """Say on the project what went wrong; ``final`` when no retry follows."""
    changes = {"error": error}
    if final:
        changes["status"] = LabelingProject.Status.FAILED
    LabelingProject.objects.filter(pk=project_id).update(**changes)


@transaction.atomic
def labeling_project_set_labels(
    *, actor: AbstractBaseUser, project: LabelingProject, labels: Iterable[str]
) -> LabelingProject:
    """Change the label set; only before the first annotation (later it would silently
    invalidate work done)."""
    from labeling.label_studio import client

    labels = clean_labels(labels, project.source_version.dataset.task_kind)
    if not labels:
        raise ValidationError(_("Give the labels the annotators choose from."))
    if project.annotations.exists():
        raise ValidationError(_("The labels are fixed once the first annotation exists."))
    if project.ls_project_id is not None:
        ls = client(project.team)
        if ls.projects.get(id=project.ls_project_id).total_annotations_number:
            raise ValidationError(_("The labels are fixed once the first annotation exists."))
        schema = task_kinds.get(project.source_version.dataset.task_kind)
        ls.projects.update(id=project.ls_project_id, label_config=schema.label_config(labels))
    old = project.labels
    project.labels = labels
    project.save(update_fields=["labels"])
    audit_record(
        action="labeling_project.labels",
        actor=actor,
        team=project.team,
        target=project,
        data={"from": old, "to": labels},
    )
    return project


# -- Who counts --------------------------------------------------------------------------------


def labeling_project_reject_outsiders(project: LabelingProject) -> int:
    """Mark the annotations that do not count, with the reason, and clear the mark of those
    that count again (a member added back). Decided from the memberships of now, at every sync
    and before every export. Returns how many do not count."""
    allowed = list(selectors.labeling_project_annotators(project))
    annotations = project.annotations.all()
    annotations.filter(annotator_ls_id__in=allowed).exclude(rejected="").update(rejected="")
    outsiders = annotations.exclude(annotator_ls_id__in=allowed)
    platform_users = dict(
        LabelStudioAccount.objects.filter(
            ls_user_id__in=outsiders.exclude(annotator_ls_id=None).values("annotator_ls_id")
        ).values_list("ls_user_id", "user__username")
    )
    for ls_user_id in set(outsiders.values_list("annotator_ls_id", flat=True)):
        if ls_user_id in platform_users:
            reason = _(
                "%(user)s is not a member of the team with a labeling role (any more): the "
                "annotation does not count."
            ) % {"user": platform_users[ls_user_id]}
        else:
            reason = _(
                "Made by a Label Studio account that is no platform member of the team: the "
                "annotation does not count."
            )
        outsiders.filter(annotator_ls_id=ls_user_id).exclude(rejected=reason[:300]).update(
            rejected=reason[:300]
        )
    return outsiders.count()


# -- Webhooks ----------------------------------------------------------------------------------


# The webhook's secret travels in a header: a URL, and a secret in it, lands in access logs.
WEBHOOK_SECRET_HEADER = "X-Platform-Webhook-Secret"  # noqa: S105 - a header name


def labeling_project_webhook_register(project: LabelingProject) -> None:
    """Ask Label Studio to call the platform (at PLATFORM_URL) when annotations change; run it
    again after PLATFORM_URL changed. A hint only: the scheduled reconciliation gets every
    annotation without it."""
    from labeling.label_studio import client

    ls = client(project.team)
    for hook in ls.webhooks.list(project=project.ls_project_id):
        if "/hooks/label-studio/" in hook.url:  # the platform's earlier one
            ls.webhooks.delete(id=hook.id)
    secret = secrets.token_urlsafe(24)
    url = platform_webhook_url(project)
    ls.webhooks.create(
        project=project.ls_project_id,
        url=url,
        headers={WEBHOOK_SECRET_HEADER: secret},
        send_payload=False,
        send_for_all_actions=False,
        actions=["ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_DELETED"],
    )
    LabelingProject.objects.filter(pk=project.pk).update(
        webhook_secret_hash=hash_token(secret), webhook_url=url
    )


def platform_webhook_url(project: LabelingProject) -> str:
    return settings.PLATFORM_URL + reverse(
        "labeling:label_studio_webhook", kwargs={"project_id": project.pk}
    )


def webhook_project(project_id: int, secret: str) -> LabelingProject | None:
    """The project a webhook call names, if its secret is right."""
    project = LabelingProject.objects.filter(pk=project_id).first()
    if project is None or not project.webhook_secret_hash:
        return None
    if not hmac.compare_digest(project.webhook_secret_hash, hash_token(secret)):
        return None
    return project


# -- Pre-annotation (the active-learning hook the deployment app calls) ------------------------


def labeling_project_preannotate(
    *, project: LabelingProject, predictions: list[dict], model_version: str
) -> int:
    """Import a model's predictions into the project's Label Studio tasks and have Label
    Studio serve the least confident first.

    ``predictions``: ``{"row": n, "value": {"label": …} | {"labels": […]} | {"entities": […]},
    "score": 0..1}`` for rows of the source version. A prediction for a row that is not a task
    of the project, or whose value does not fit the project's labels, is refused."""
    from labeling.label_studio import client

    if project.ls_project_id is None:
        raise ValidationError(_("The project is not in Label Studio yet."))
    schema = task_kinds.get(project.source_version.dataset.task_kind)
    tasks = dict(project.tasks.values_list("row", "ls_task_id"))
    rows = selectors.rows_by_number(project.source_version, {p["row"] for p in predictions})
    payload = []
    for p in predictions:
        row_number = p["row"]
        if row_number not in tasks:
            raise ValidationError(
                _("Row %(row)s is not a task of this project.") % {"row": row_number}
            )
        candidate = {**rows[row_number], **p["value"]}
        # The same checks as an annotation: labels of the project, spans inside the text.
        try:
            schema.parse_ls_result(schema.ls_result(candidate), rows[row_number], project.labels)
        except RowError as exc:
            raise ValidationError(
                _("Row %(row)s: %(error)s") % {"row": row_number, "error": exc.message}
            ) from exc
        payload.append(
            {
                "task": tasks[row_number],
                "result": schema.ls_result(candidate),
                "score": float(p["score"]),
                "model_version": model_version,
            }
        )
    ls = client(project.team)
    ls.projects.import_predictions(id=project.ls_project_id, request=payload)
    ls.projects.update(
        id=project.ls_project_id, sampling="Uncertainty sampling", model_version=model_version
    )
    audit_record(
        action="labeling_project.preannotate",
        actor=None,
        actor_username=model_version,
        team=project.team,
        target=project,
        data={"predictions": len(payload), "model_version": model_version},
    )
    return len(payload)
