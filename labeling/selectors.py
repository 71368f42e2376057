"""Reads of the labeling app: those the console views and the API share, all scoped to a team;
and those the app's services and tasks make of one version or project, or across teams (the
projects the reconciliation syncs or pushes again)."""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

from django.core.files.storage import default_storage
from django.db.models import Count, Max, QuerySet, Sum
from django.http import Http404

from console.models import Team
from labeling import task_kinds
from labeling.models import (
    Dataset,
    DatasetVersion,
    ImportJob,
    LabelingProject,
    LabelStudioAccount,
    Upload,
)
from labeling.pipeline import PAGE_INDEX_STEP
from labeling.readers import FileError, detect, open_records


def team_datasets(team: Team) -> QuerySet[Dataset]:
    return Dataset.objects.filter(team=team).order_by("-created_at")


def team_datasets_overview(team: Team) -> QuerySet[Dataset]:
    """The team's datasets with their number of versions (``version_count``) and the number of
    the latest (``latest_version_number``), in one query."""
    return (
        team_datasets(team)
        .select_related("created_by")
        .annotate(version_count=Count("versions"), latest_version_number=Max("versions__number"))
    )


def dataset_get(team: Team, dataset_id: int) -> Dataset:
    dataset = team_datasets(team).filter(pk=dataset_id).first()
    if dataset is None:
        raise Http404("No such dataset.")
    return dataset


def version_get(dataset: Dataset, number: int) -> DatasetVersion:
    version = dataset.versions.filter(number=number).first()
    if version is None:
        raise Http404("No such version.")
    return version


MAX_VERSION_NUMBER = 2**31 - 1  # a PositiveIntegerField's range on every database


def versions_get(dataset: Dataset, numbers: list[int]) -> list[DatasetVersion]:
    """The versions of these numbers; 404 naming the first that does not exist."""
    # Numbers beyond any version's (hostile input) are missing, not sent to the database,
    # which cannot hold them (an overflow error on SQLite, out of range on PostgreSQL).
    possible = [n for n in numbers if 0 < n <= MAX_VERSION_NUMBER]
    versions = {v.number: v for v in dataset.versions.filter(number__in=possible)}
    missing = [n for n in numbers if n not in versions]
    if missing:
        raise Http404(f"No version v{missing[0]} in this dataset.")
    return [versions[n] for n in dict.fromkeys(numbers)]


def upload_get(team: Team, upload_id) -> Upload:
    upload = Upload.objects.filter(team=team, pk=upload_id).first()
    if upload is None:
        raise Http404("No such upload.")
    return upload


def import_job_get(team: Team, job_id: int) -> ImportJob:
    job = ImportJob.objects.filter(team=team, pk=job_id).select_related("dataset").first()
    if job is None:
        raise Http404("No such import.")
    return job


@dataclass
class Preview:
    format: str
    encoding: str | None
    detected_encoding: str | None
    confident: bool
    columns: list[str]
    rows: list[dict]
    mapping: dict[str, str]
    error: str = ""


def upload_preview(
    upload: Upload, kind: str, fmt: str | None = None, encoding: str | None = None
) -> Preview:
    """What the platform makes of an upload: format, encoding, columns, first rows, mapping."""
    with default_storage.open(upload.storage_name, "rb") as f:
        detected = detect(upload.filename, f)
        fmt = fmt or detected.format
        encoding = None if fmt == "xlsx" else encoding or detected.encoding or "utf-8"
        try:
            columns, records = open_records(f, fmt, encoding)
            rows = [r for _n, r in islice(records, 10) if isinstance(r, dict)]
        except FileError as exc:
            return Preview(
                fmt, encoding, detected.encoding, detected.confident, [], [], {}, str(exc)
            )
    mapping = task_kinds.get(kind).propose_mapping(columns)
    return Preview(fmt, encoding, detected.encoding, detected.confident, columns, rows, mapping)


@dataclass
class RowsPage:
    rows: list[tuple[int, dict]]  # (1-based row number in the version, row)
    page: int
    has_next: bool


def version_rows(
    version: DatasetVersion,
    *,
    page: int = 1,
    per_page: int = 50,
    q: str = "",
    label: str = "",
    split: str = "",
) -> RowsPage:
    """A page of rows. Unfiltered pages seek by the version's offset index; filters stream."""
    page = max(page, 1)
    start = (page - 1) * per_page
    schema = task_kinds.get(version.dataset.task_kind)
    with default_storage.open(version.data_file, "rb") as f:
        if q or label or split:
            rows = (
                (number, row)
                for number, row in ((n, json.loads(line)) for n, line in enumerate(f, start=1))
                if (not split or row.get("split") == split)
                and (not label or label in schema.row_labels(row))
                and (not q or q in schema.dedup_key(row))
            )
            return _rows_page(rows, page, per_page, skip=start)
        first = 0
        if version.page_index:
            block = min(start // PAGE_INDEX_STEP, len(version.page_index) - 1)
            f.seek(version.page_index[block])
            first = block * PAGE_INDEX_STEP
        # The lines before the page are passed over, not parsed.
        lines = islice(enumerate(f, start=first + 1), start - first, None)
        return _rows_page(((n, json.loads(line)) for n, line in lines), page, per_page)


def report_entries(path: str, *, page: int = 1, per_page: int = 50, reason: str = "") -> RowsPage:
    if not path:
        return RowsPage([], 1, False)
    start = (max(page, 1) - 1) * per_page
    with default_storage.open(path, "rb") as f:
        entries = ((n, json.loads(line)) for n, line in enumerate(f, start=1))
        if reason:
            entries = ((n, entry) for n, entry in entries if entry["reason"] == reason)
        return _rows_page(entries, page, per_page, skip=start)


def _rows_page(
    numbered: Iterator[tuple[int, dict]], page: int, per_page: int, skip: int = 0
) -> RowsPage:
    """``per_page`` of ``numbered`` after its first ``skip``, and whether more follow: reads no
    further than one past the page."""
    found = list(islice(numbered, skip, skip + per_page + 1))
    return RowsPage(found[:per_page], page, len(found) > per_page)


@dataclass
class Comparison:
    added: int
    removed: int
    relabeled: int
    unchanged: int
    examples: dict[str, list[dict]]


def version_compare(old: DatasetVersion, new: DatasetVersion, examples: int = 20) -> Comparison:
    """Rows added, removed and relabeled from ``old`` to ``new``, matched by their text."""
    schema = task_kinds.get(old.dataset.task_kind)

    def annotation(row: dict) -> str:
        return json.dumps(
            {k: v for k, v in row.items() if k not in schema.text_fields and k != "split"},
            ensure_ascii=False,
            sort_keys=True,
        )

    before: dict[int, tuple[str, str]] = {}
    with default_storage.open(old.data_file, "rb") as f:
        for line in f:
            row = json.loads(line)
            before[hash(schema.dedup_key(row))] = (annotation(row), line.decode())
    added = relabeled = unchanged = 0
    shown: dict[str, list[dict]] = {"added": [], "removed": [], "relabeled": []}
    with default_storage.open(new.data_file, "rb") as f:
        for line in f:
            row = json.loads(line)
            old_entry = before.pop(hash(schema.dedup_key(row)), None)
            if old_entry is None:
                added += 1
                if len(shown["added"]) < examples:
                    shown["added"].append(row)
            elif old_entry[0] != annotation(row):
                relabeled += 1
                if len(shown["relabeled"]) < examples:
                    shown["relabeled"].append({"old": json.loads(old_entry[1]), "new": row})
            else:
                unchanged += 1
    for _ann, line in islice(before.values(), examples):
        shown["removed"].append(json.loads(line))
    return Comparison(added, len(before), relabeled, unchanged, shown)


def version_file(version: DatasetVersion, kind: str) -> tuple[str, str]:
    """The storage name and download name of a version's ``original``, ``normalized`` or
    ``report`` file; 404 for anything else."""
    base = f"{version.dataset.name}-v{version.number}"
    name, filename = {
        "original": (version.original_file, version.original_name or f"{base}.{version.format}"),
        "normalized": (version.data_file, f"{base}.jsonl"),
        "report": (version.report_file, f"{base}-report.jsonl"),
    }.get(kind, ("", ""))
    if not name:
        raise Http404("No such file.")
    return name, filename


def team_labeling_projects(team: Team):
    from labeling.models import LabelingProject

    return LabelingProject.objects.filter(team=team).select_related("source_version__dataset")


def labeling_project_get(team: Team, project_id: int):
    project = team_labeling_projects(team).filter(pk=project_id).first()
    if project is None:
        raise Http404("No such labeling project.")
    return project


def labeling_project_answers(project) -> dict[int, list[tuple[str, dict]]]:
    """Valid annotations that count (by current labeling members) by row: [(annotator, value)],
    one per annotator and task, their latest: an annotator who posts a task's annotation three
    times (Label Studio lets them) still has one vote."""
    from django.db.models import F

    latest: dict[tuple[int, object], tuple[int, str, dict]] = {}
    counted = (
        project.annotations.filter(valid=True, rejected="")
        .select_related("task")
        .order_by(F("ls_updated_at").asc(nulls_first=True), "ls_annotation_id")
    )
    for annotation in counted:
        who = annotation.annotator_ls_id or annotation.annotator
        # Later ones replace earlier ones, the annotator keeping their first place.
        latest[(annotation.task_id, who)] = (
            annotation.task.row,
            annotation.annotator,
            annotation.value,
        )
    answers: dict[int, list[tuple[str, dict]]] = {}
    for row, annotator, value in latest.values():
        answers.setdefault(row, []).append((annotator, value))
    return answers


def labeling_project_progress(project) -> dict:
    """Tasks done (annotated by as many annotators as the project asks), and per annotator."""
    from collections import Counter

    answers = labeling_project_answers(project)
    per_annotator = Counter(who for rows in answers.values() for who, _v in rows)
    done = sum(1 for rows in answers.values() if len(rows) >= project.overlap)
    return {
        "done": done,
        "total": project.tasks_total,
        "annotations": sum(per_annotator.values()),
        "invalid": project.annotations.filter(valid=False).count(),
        "rejected": project.annotations.exclude(rejected="").count(),
        "per_annotator": dict(per_annotator.most_common()),
    }


def labeling_project_rejected(project, limit: int = 50) -> list[dict]:
    """Annotations that Label Studio has but that do not count, with the reason."""
    rejected = project.annotations.exclude(rejected="").select_related("task").order_by("pk")
    return [
        {"row": a.task.row, "annotator": a.annotator, "reason": a.rejected}
        for a in rejected[:limit]
    ]


def labeling_project_agreement(project) -> dict:
    from labeling.consensus import agreement

    return agreement(labeling_project_answers(project), project.source_version.dataset.task_kind)


def rows_by_number(version: DatasetVersion, wanted: set[int]) -> dict[int, dict]:
    """The rows numbered in ``wanted`` (1-based) of a version's normalised data."""
    rows = {}
    with default_storage.open(version.data_file, "rb") as f:
        for number, line in enumerate(f, start=1):
            if number in wanted:
                rows[number] = json.loads(line)
    return rows


def team_upload_bytes(team: Team) -> int:
    """What the team's uploads take in storage (console.quotas): their declared sizes, reserved
    from creation so that uploads under way cannot together pass the quota, and the kept
    originals. Abandoned ones give their room back when they expire (uploads_expire)."""
    return Upload.objects.filter(team=team).aggregate(n=Sum("size"))["n"] or 0


def labeling_project_annotators(project: LabelingProject) -> dict[int, str]:
    """The Label Studio accounts whose annotations count: those of the team's current members
    with a labeling role (owner, maintainer, annotator) whose user is active, by LS user id."""
    from console.models import Membership
    from console.roles import PERMISSIONS, Perm

    members = Membership.objects.filter(
        team_id=project.team_id, role__in=PERMISSIONS[Perm.ANNOTATE], user__is_active=True
    ).values_list("user_id", flat=True)
    return dict(
        LabelStudioAccount.objects.filter(user_id__in=members).values_list(
            "ls_user_id", "user__username"
        )
    )


def labeling_projects_to_reconcile() -> list[int]:
    return list(
        LabelingProject.objects.filter(status=LabelingProject.Status.READY).values_list(
            "pk", flat=True
        )
    )
