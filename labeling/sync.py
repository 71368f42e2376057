"""Sync with Label Studio: a project's annotations taken in (checked, attributed, audited), on a
webhook's hint or by the scheduled reconciliation; and the reconciliation of accounts, which
keeps each Label Studio account in exactly the organisations of its user's teams."""

import logging
from collections import Counter, defaultdict

from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from console.models import Team
from console.notifications import notify
from console.services import audit_record
from labeling import selectors, task_kinds
from labeling.models import Annotation, LabelingProject, LabelStudioAccount
from labeling.projects import (
    labeling_project_reject_outsiders,
    labeling_project_webhook_register,
    platform_webhook_url,
)
from labeling.task_kinds.base import RowError

logger = logging.getLogger(__name__)


def labeling_project_sync(project_id: int) -> dict[str, int]:
    """Take in every annotation of the project's Label Studio project: new ones, changed ones
    (by their updated_at), and forget deleted ones. Each is checked against the project's
    labels and the row's text; an invalid one is kept with its reason. Safe to run any time:
    webhooks ask for it, and the scheduled reconciliation runs it whatever they say."""
    from label_studio_sdk.core.api_error import ApiError

    from labeling.label_studio import client

    project = LabelingProject.objects.select_related("source_version__dataset", "team").get(
        pk=project_id
    )
    if project.ls_project_id is None:
        return {"created": 0, "updated": 0, "deleted": 0, "invalid": 0}
    ls = client(project.team)
    if project.webhook_url != platform_webhook_url(project):
        # Registered before PLATFORM_URL (or the webhook's route) changed: its calls go nowhere.
        # A hint only: if Label Studio refuses it, the sync goes on and the next one tries again.
        try:
            labeling_project_webhook_register(project)
        except Exception:
            logger.warning(
                "webhook of labeling project %s not registered", project.pk, exc_info=True
            )
    schema = task_kinds.get(project.source_version.dataset.task_kind)
    tasks = {t.ls_task_id: t for t in project.tasks.all()}
    known = {a.ls_annotation_id: a for a in project.annotations.all()}
    ls_items = []
    for ls_task in ls.tasks.list(project=project.ls_project_id, fields="all"):
        task = tasks.get(ls_task.id)
        if task is None:  # made in Label Studio by hand: not one of ours
            continue
        for raw in ls_task.annotations or []:
            item = raw if isinstance(raw, dict) else raw.model_dump()
            if item.get("was_cancelled"):
                continue
            ls_items.append((task, item))
    rows = selectors.rows_by_number(project.source_version, {task.row for task, _item in ls_items})
    # Annotators with a platform account are named by it; others by their Label Studio e-mail.
    emails: dict[int, str] = dict(
        LabelStudioAccount.objects.values_list("ls_user_id", "user__username")
    )

    def email_of(user_id) -> str:
        if not isinstance(user_id, int):
            return ""
        if user_id not in emails:
            try:
                emails[user_id] = ls.users.get(id=user_id).email or str(user_id)
            except ApiError:  # not in the team's organisation (any more)
                emails[user_id] = f"Label Studio #{user_id}"
        return emails[user_id]

    counts = {"created": 0, "updated": 0, "deleted": 0, "invalid": 0}
    # Who changed how many annotations, for the audit log; their names as the rows have them.
    by_annotator: dict[int | None, Counter] = defaultdict(Counter)
    names: dict[int | None, str] = {}
    seen = set()
    with transaction.atomic():
        for task, item in ls_items:
            seen.add(item["id"])
            updated_at = item.get("updated_at")
            existing = known.get(item["id"])
            if (
                existing
                and existing.ls_updated_at
                and updated_at
                and (existing.ls_updated_at.isoformat() == _parse_time(updated_at).isoformat())
            ):
                continue
            try:
                value = schema.parse_ls_result(
                    item.get("result") or [], rows[task.row], project.labels
                )
                valid, error = True, ""
            except RowError as exc:
                value, valid, error = {}, False, exc.message
                counts["invalid"] += 1
            # Label Studio gives the annotator as an id, or as {"id", "email", …} in task lists.
            who = item.get("completed_by")
            who_id = who.get("id") if isinstance(who, dict) else who
            who_name = email_of(who_id) if isinstance(who_id, int) else ""
            fields = {
                "task": task,
                "annotator_ls_id": who_id if isinstance(who_id, int) else None,
                "annotator": str(who_name or who_id or ""),
                "value": value,
                "valid": valid,
                "error": str(error),
                "ls_updated_at": _parse_time(updated_at) if updated_at else None,
                "synced_at": timezone.now(),
            }
            Annotation.objects.update_or_create(
                project=project, ls_annotation_id=item["id"], defaults=fields
            )
            counts["updated" if existing else "created"] += 1
            by_annotator[fields["annotator_ls_id"]]["updated" if existing else "created"] += 1
            names[fields["annotator_ls_id"]] = fields["annotator"]
        gone = [pk for pk in known if pk not in seen]
        for pk in gone:
            by_annotator[known[pk].annotator_ls_id]["deleted"] += 1
            names.setdefault(known[pk].annotator_ls_id, known[pk].annotator)
        counts["deleted"] = project.annotations.filter(ls_annotation_id__in=gone).delete()[0]
        labeling_project_reject_outsiders(project)
        LabelingProject.objects.filter(pk=project.pk).update(last_synced_at=timezone.now())
        _audit_annotations(project, by_annotator, names)
        if counts["created"] or counts["updated"]:
            _notify_if_finished(project)
    return counts


def _notify_if_finished(project: LabelingProject) -> None:
    """Every task annotated by as many annotators as the project asks: the team is told,
    once."""
    subject = f"labeling:{project.pk}"
    if project.team.notifications.filter(event="labeling_finished", subject=subject).exists():
        return
    progress = selectors.labeling_project_progress(project)
    if progress["total"] and progress["done"] >= progress["total"]:
        notify(
            project.team,
            "labeling_finished",
            _("Labeling project %(name)s is finished: %(n)d tasks annotated")
            % {"name": project.name, "n": progress["total"]},
            link=reverse("labeling:project", args=[project.team.slug, project.pk]),
            subject=subject,
        )


def _audit_annotations(
    project: LabelingProject, by_annotator: dict[int | None, Counter], names: dict[int | None, str]
) -> None:
    """One audit event per annotator whose work a sync took in: who labeled how many tasks of
    which project (an annotator with a platform account is its actor)."""
    users = {
        a.ls_user_id: a.user
        for a in LabelStudioAccount.objects.filter(
            ls_user_id__in=list(by_annotator)
        ).select_related("user")
    }
    for ls_user_id, changed in by_annotator.items():
        user = users.get(ls_user_id)
        audit_record(
            action="labeling_project.annotations",
            actor=user,
            actor_username=names.get(ls_user_id, "") if user is None else "",
            team=project.team,
            target=project,
            data=dict(changed),
        )


def _parse_time(value: str):
    from django.utils.dateparse import parse_datetime

    return parse_datetime(value) if isinstance(value, str) else value


def labeling_project_sync_request(project: LabelingProject) -> None:
    """Queue a sync of the project (a webhook said something changed)."""
    from labeling.tasks import sync_labeling_project

    transaction.on_commit(lambda: sync_labeling_project.delay(project.pk))


# -- Label Studio accounts: who is in which team's organisation --------------------------------


def label_studio_account_update(user) -> None:
    """Bring ``user``'s Label Studio account in line with their memberships now: removed from
    the organisations of teams where they no longer label; deactivated, its tokens deleted and
    its sessions ended where they label nowhere or the user is deactivated. Called when a
    membership or the user changes (``labeling.signals``); the reconciliation is the guarantee."""
    from labeling.label_studio import account_sync

    if LabelStudioAccount.objects.filter(user=user).exists():
        account_sync(user)


def label_studio_members_converge() -> dict:
    """The reconciliation of accounts (beat, every minute): every team has its organisation;
    each platform account is a member of exactly the organisations of the teams where its user
    labels, or revoked; anybody else (an account signed up through a member's invite link,
    added by hand) is removed from the teams' organisations, and their invite links reset."""
    from labeling import label_studio_admin
    from labeling.label_studio import labeling_teams

    accounts = list(LabelStudioAccount.objects.select_related("user"))
    wanted = [
        {
            "email": a.email,
            "teams": [t.pk for t in labeling_teams(a.user)],
            "active": a.active_team_id,
        }
        for a in accounts
    ]
    result = label_studio_admin.converge(list(Team.objects.order_by("pk")), wanted)
    for a in accounts:
        got = result["accounts"].get(a.email)
        if got is not None and got["active"] != a.active_team_id:
            LabelStudioAccount.objects.filter(pk=a.pk).update(active_team_id=got["active"])
    if result["revoked"] or result["removed"]:
        logger.info(
            "Label Studio: revoked %s; removed from teams' organisations %s",
            result["revoked"],
            result["removed"],
        )
    return result
