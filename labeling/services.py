"""Every write of the labeling app: datasets, chunked uploads, imports, merges."""

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import hmac
import json
import logging
import random
import secrets
import tempfile
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files import File
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction
from django.db.models import Max, ProtectedError
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from console.models import Team, hash_token
from console.quotas import team_storage_check
from console.services import audit_record
from labeling import consensus, pipeline, selectors
from labeling.models import (
    Annotation,
    Dataset,
    DatasetVersion,
    ImportJob,
    LabelingProject,
    LabelingTask,
    LabelStudioAccount,
    Upload,
)
from labeling.readers import ENCODINGS, FORMATS, FileError
from labeling.task_kinds import RowError, TaskKind, schema_for

logger = logging.getLogger(__name__)


def _team_prefix(team: Team) -> str:
    return f"teams/{team.pk}"


class _LocalFile(File):
    """A local file that storage may move into place instead of copying (FileSystemStorage
    renames a file that has a temporary_file_path; S3 storage streams it)."""

    def temporary_file_path(self) -> str:
        return self.file.name


# A full, read-only or forbidden disk: the platform's storage, not the user's file, is at fault.
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


def _store(path: Path, name: str) -> str:
    name = default_storage.get_available_name(name)
    try:
        with open(path, "rb") as f:
            stored = default_storage.save(name, _LocalFile(f))
    except OSError:
        # The disk filled up mid-way: no half-written file stays behind.
        if default_storage.exists(name):
            default_storage.delete(name)
        raise
    path.unlink(missing_ok=True)
    return stored


def staging_path(upload: Upload) -> Path:
    # The name is the upload's UUID: nothing the user sent becomes part of a path.
    return Path(settings.UPLOAD_STAGING_DIR) / f"{upload.pk}.part"


# -- Datasets ---------------------------------------------------------------------------------


def _clean_labels(labels: Iterable[str]) -> list[str]:
    cleaned = []
    for label in labels:
        label = label.strip()
        if label and label not in cleaned:
            cleaned.append(label)
    return cleaned


@transaction.atomic
def dataset_create(
    *,
    actor: AbstractBaseUser,
    team: Team,
    name: str,
    task_kind: str,
    description: str = "",
    labels: Iterable[str] = (),
) -> Dataset:
    name = name.strip()
    if not name:
        raise ValidationError(_("A dataset needs a name."))
    if task_kind not in TaskKind.values:
        raise ValidationError(_("Unknown task kind “%(kind)s”.") % {"kind": task_kind})
    if Dataset.objects.filter(team=team, name=name).exists():
        raise ValidationError(
            _("The team already has a dataset named “%(name)s”.") % {"name": name}
        )
    dataset = Dataset.objects.create(
        team=team,
        name=name,
        task_kind=task_kind,
        description=description.strip(),
        labels=_clean_labels(labels),
        created_by=actor,
    )
    audit_record(
        action="dataset.create", actor=actor, team=team, target=dataset, data={"kind": task_kind}
    )
    return dataset


@transaction.atomic
def dataset_delete(*, actor: AbstractBaseUser, dataset: Dataset) -> None:
    """Delete a dataset and its files, unless something (a labeling project, a job) uses it."""
    names = {
        name
        for version in dataset.versions.all()
        for name in (version.data_file, version.report_file, version.original_file)
        if name
    }
    # An upload imported into another dataset too keeps its file for that one.
    names -= set(
        DatasetVersion.objects.exclude(dataset=dataset)
        .filter(original_file__in=names)
        .values_list("original_file", flat=True)
    )
    name, team = dataset.name, dataset.team
    audit_record(action="dataset.delete", actor=actor, team=team, target=dataset)
    try:
        with transaction.atomic():
            dataset.delete()
    except ProtectedError as exc:
        users = sorted({f"{obj._meta.verbose_name} “{obj}”" for obj in exc.protected_objects})
        raise ValidationError(
            _("“%(name)s” is in use and cannot be deleted: %(users)s.")
            % {"name": name, "users": ", ".join(users)}
        ) from exc
    transaction.on_commit(lambda: [default_storage.delete(n) for n in names])


# -- Chunked uploads ------------------------------------------------------------------------


class UploadOffsetMismatch(Exception):
    """A chunk that does not start where the upload stands; the client resumes from ``offset``."""

    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


def _clean_filename(filename: str) -> str:
    """The name a user gave a file, as a label only (it never becomes a path): its last
    component, without control characters, at most 255 characters with its extension kept."""
    try:
        filename.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(
            _("The file name is not valid Unicode (it holds a lone surrogate).")
        ) from None
    filename = "".join(c for c in filename if unicodedata.category(c) != "Cc")
    filename = Path(filename.replace("\\", "/")).name.strip()
    if filename in ("", ".", ".."):
        raise ValidationError(_("The file needs a name."))
    if len(filename) > 255:
        stem, dot, ext = filename.rpartition(".")
        keep = dot + ext if stem and len(ext) <= 16 else ""
        filename = filename[: 255 - len(keep)] + keep
    return filename


def upload_create(*, actor: AbstractBaseUser, team: Team, filename: str, size: int) -> Upload:
    filename = _clean_filename(filename)
    if size <= 0:
        raise ValidationError(_("The file is empty."))
    if size > settings.UPLOAD_MAX_BYTES:
        raise ValidationError(
            _("The file is %(size)s MB; the limit of this platform is %(limit)s MB.")
            % {
                "size": round(size / 2**20, 1),
                "limit": round(settings.UPLOAD_MAX_BYTES / 2**20),
            }
        )
    # The declared size is reserved at once (team_upload_bytes counts it): uploads created side
    # by side cannot each find the same room. The team's row, locked, puts them in a line.
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()
        team_storage_check(team, size)
        upload = Upload.objects.create(team=team, created_by=actor, filename=filename, size=size)
    path = staging_path(upload)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return upload


def upload_write_chunk(*, upload: Upload, offset: int, stream: BinaryIO, length: int) -> Upload:
    """Append ``length`` bytes at ``offset``, which must be where the upload stands (as in the
    tus protocol); any other offset is refused with the offset to resume from.

    The body is read outside any database transaction: a slow client must not hold the
    database's write lock (SQLite's is the whole database's). A lock on the staging file keeps
    two chunks of one upload apart; the bookkeeping is one short UPDATE."""
    try:
        part = open(staging_path(upload), "r+b")  # closed by the `with` below
    except FileNotFoundError:
        upload = Upload.objects.filter(pk=upload.pk).first()
        if upload is not None and upload.status == Upload.Status.COMPLETE:
            raise UploadOffsetMismatch(upload.received) from None
        raise ValidationError(_("The upload expired or was deleted: start it again.")) from None
    with part:
        try:
            fcntl.flock(part, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another chunk of this upload is being written: resume where it ends.
            upload.refresh_from_db()
            raise UploadOffsetMismatch(upload.received) from None
        upload = Upload.objects.select_related("team").get(pk=upload.pk)
        if upload.status == Upload.Status.COMPLETE or offset != upload.received:
            raise UploadOffsetMismatch(upload.received)
        if offset + length > upload.size:
            raise ValidationError(_("The chunk goes past the declared size of the file."))
        # No quota check here: the declared size was reserved against the quota at creation.
        written = 0
        part.seek(offset)
        while written < length:
            block = stream.read(min(1024 * 1024, length - written))
            if not block:
                break
            part.write(block)
            written += len(block)
        # A dropped connection leaves a short chunk: keep what arrived, resume after it.
        part.truncate(offset + written)
        part.flush()
        Upload.objects.filter(pk=upload.pk, received=offset).update(received=offset + written)
        upload.received = offset + written
        if upload.received == upload.size:
            upload = _upload_complete(upload)
    return upload


def uploads_expire() -> int:
    """Beat: uploads begun more than UPLOAD_EXPIRY_HOURS ago that never completed, or completed
    and were never imported into a version (nor are being imported), are deleted: their files
    and rows. Returns how many."""
    cutoff = timezone.now() - timezone.timedelta(hours=settings.UPLOAD_EXPIRY_HOURS)
    busy = ImportJob.objects.filter(
        status__in=(ImportJob.Status.QUEUED, ImportJob.Status.RUNNING), upload__isnull=False
    ).values("upload_id")
    originals = DatasetVersion.objects.exclude(original_file="").values("original_file")
    expired = (
        Upload.objects.filter(created_at__lt=cutoff)
        .exclude(pk__in=busy)
        .exclude(storage_name__in=originals)
    )
    count = 0
    for upload in expired.iterator():
        with contextlib.ExitStack() as held:
            try:
                part = held.enter_context(open(staging_path(upload), "r+b"))
                # A chunk being written right now holds this lock: that upload is alive.
                fcntl.flock(part, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except FileNotFoundError:
                pass  # complete (its file is in storage) or never staged
            except BlockingIOError:
                continue
            # Checked again as it is deleted: an import may have started meanwhile.
            with transaction.atomic():
                deleted, _rows = expired.filter(pk=upload.pk).delete()
            if not deleted:
                continue
            staging_path(upload).unlink(missing_ok=True)
        if upload.storage_name:
            default_storage.delete(upload.storage_name)
        count += 1
        logger.info("upload %s (%s) expired unimported and was deleted", upload.pk, upload.filename)
    return count


def _upload_complete(upload: Upload) -> Upload:
    path = staging_path(upload)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(block)
    name = _store(path, f"{_team_prefix(upload.team)}/uploads/{upload.pk}")
    Upload.objects.filter(pk=upload.pk).update(
        status=Upload.Status.COMPLETE, storage_name=name, sha256=digest.hexdigest()
    )
    upload.refresh_from_db()
    return upload


# -- Imports ---------------------------------------------------------------------------------


def _import_options(dataset: Dataset, options: dict) -> pipeline.ImportOptions:
    schema = schema_for(dataset.task_kind)
    mapping = {k: v for k, v in (options.get("mapping") or {}).items() if v}
    unknown = sorted(set(mapping) - set(schema.field_names()))
    if unknown:
        raise ValidationError(
            _("Unknown field(s) for %(kind)s: %(fields)s.")
            % {"kind": dataset.task_kind, "fields": ", ".join(unknown)}
        )
    ratios = tuple(float(r) for r in options.get("ratios") or (0.8, 0.1, 0.1))
    if len(ratios) != 3 or any(r < 0 for r in ratios) or sum(ratios) <= 0:
        raise ValidationError(_("Split ratios are three non-negative numbers: train, dev, test."))
    total = sum(ratios)
    return pipeline.ImportOptions(
        mapping=mapping,
        fullwidth_to_halfwidth=bool(options.get("fullwidth_to_halfwidth", False)),
        strict=bool(options.get("strict", False)),
        drop_duplicates=bool(options.get("drop_duplicates", True)),
        ratios=tuple(round(r / total, 6) for r in ratios),
        seed=int(options.get("seed", 42)),
        labels=dataset.label_set(),
    )


@transaction.atomic
def import_start(
    *,
    actor: AbstractBaseUser,
    dataset: Dataset,
    upload: Upload,
    fmt: str,
    encoding: str | None,
    options: dict,
) -> ImportJob:
    if upload.team_id != dataset.team_id:
        raise ValidationError(_("No such upload."))
    if upload.status != Upload.Status.COMPLETE:
        raise ValidationError(
            _("The upload is not complete: %(received)d of %(size)d bytes arrived.")
            % {"received": upload.received, "size": upload.size}
        )
    if fmt not in FORMATS:
        raise ValidationError(_("Unknown format “%(format)s”.") % {"format": fmt})
    if fmt != "xlsx" and encoding not in ENCODINGS:
        raise ValidationError(_("Unsupported encoding “%(encoding)s”.") % {"encoding": encoding})
    parsed = _import_options(dataset, options)
    return _import_job_queue(
        actor=actor,
        dataset=dataset,
        audit=(
            "dataset.import",
            dataset,
            {"file": upload.filename, "format": fmt, "encoding": encoding},
        ),
        upload=upload,
        source=DatasetVersion.Source.UPLOAD,
        format=fmt,
        encoding=encoding if fmt != "xlsx" else "",
        options=parsed.as_dict(),
        bytes_total=upload.size,
    )


@transaction.atomic
def version_merge(
    *, actor: AbstractBaseUser, dataset: Dataset, versions: list[DatasetVersion], options: dict
) -> ImportJob:
    """Merge versions of one dataset into a new version (deduplicated, split anew)."""
    if len(versions) < 2:
        raise ValidationError(_("Choose at least two versions to merge."))
    if any(v.dataset_id != dataset.pk for v in versions):
        raise ValidationError(_("Only versions of the same dataset can be merged."))
    schema = schema_for(dataset.task_kind)
    options = {**options, "mapping": {f: f for f in schema.field_names()}}
    parsed = _import_options(dataset, options)
    return _import_job_queue(
        actor=actor,
        dataset=dataset,
        audit=("dataset.merge", dataset, {"versions": [v.number for v in versions]}),
        source=DatasetVersion.Source.MERGE,
        parents=[v.pk for v in versions],
        format="jsonl",
        encoding="utf-8",
        options=parsed.as_dict(),
        bytes_total=sum(default_storage.size(v.data_file) for v in versions),
    )


def _import_job_queue(
    *, actor: AbstractBaseUser, dataset: Dataset, audit: tuple[str, object, dict], **fields
) -> ImportJob:
    """Create an import job (an upload, a merge, a labeling export), record its audit event
    (action, target, data) and queue it for the worker once the transaction commits."""
    from labeling.tasks import run_import_job

    job = ImportJob.objects.create(team=dataset.team, dataset=dataset, created_by=actor, **fields)
    action, target, data = audit
    audit_record(
        action=action, actor=actor, team=dataset.team, target=target, data={"job": job.pk, **data}
    )
    transaction.on_commit(lambda: run_import_job.delay(job.pk))
    return job


def _options_from(job: ImportJob) -> pipeline.ImportOptions:
    o = job.options
    return pipeline.ImportOptions(
        mapping=o["mapping"],
        fullwidth_to_halfwidth=o["fullwidth_to_halfwidth"],
        strict=o["strict"],
        drop_duplicates=o["drop_duplicates"],
        ratios=tuple(o["ratios"]),
        seed=o["seed"],
        labels=frozenset(o["labels"]) if o["labels"] is not None else None,
        keep_splits=o.get("keep_splits", False),
    )


def _merged_input(job: ImportJob, workdir: Path) -> Path:
    """The rows of the merged versions, one JSON object a line, without their old splits."""
    path = workdir / "merged-input.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for version in DatasetVersion.objects.filter(pk__in=job.parents).order_by("number"):
            with default_storage.open(version.data_file, "rb") as f:
                for line in f:
                    row = json.loads(line)
                    row.pop("split", None)
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def import_run(job_id: int) -> ImportJob:
    """Run an import job to its end (called by the Celery task; safe to run again)."""
    job = ImportJob.objects.select_related("dataset__team", "upload").get(pk=job_id)
    if job.status == ImportJob.Status.SUCCEEDED:
        return job
    ImportJob.objects.filter(pk=job.pk).update(
        status=ImportJob.Status.RUNNING, rows_read=0, bytes_read=0, error=""
    )
    dataset = job.dataset
    staging = Path(settings.UPLOAD_STAGING_DIR)
    staging.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"import-{job.pk}-", dir=staging) as tmp:
        workdir = Path(tmp)
        try:
            # Merges and labeling exports make their input; either way `with` closes it.
            if job.source == DatasetVersion.Source.MERGE:
                stream = open(_merged_input(job, workdir), "rb")
            elif job.source == DatasetVersion.Source.LABELING:
                stream = open(_labeling_input(job, workdir), "rb")
            else:
                stream = default_storage.open(job.upload.storage_name, "rb")
            with stream:

                def progress(rows: int) -> None:
                    ImportJob.objects.filter(pk=job.pk).update(
                        rows_read=rows, bytes_read=stream.tell()
                    )

                result = pipeline.run_import(
                    stream,
                    fmt=job.format,
                    encoding=job.encoding or None,
                    schema=schema_for(dataset.task_kind),
                    options=_options_from(job),
                    workdir=workdir,
                    progress=progress,
                )
        except (pipeline.ImportFailed, FileError) as exc:
            return _import_failed(job, str(exc), workdir / "report.jsonl")
        except Exception as exc:
            return _import_crashed(job, exc)
        try:
            return _import_succeeded(job, result)
        except Exception as exc:
            return _import_crashed(job, exc)


def _import_crashed(job: ImportJob, exc: Exception) -> ImportJob:
    """Not the file's fault. A full or unwritable storage says so on the job; anything else is
    an internal error there, raised again for Celery to log the traceback."""
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        return _import_failed(job, _storage_error(exc), Path("/dev/null"))
    _import_failed(job, _("Internal error: %(error)s") % {"error": exc}, Path("/dev/null"))
    raise exc


def _storage_error(exc: OSError) -> str:
    return _(
        "The platform's storage could not be written (%(error)s: %(path)s). Nothing was "
        "changed and the dataset's versions are intact: free space (or fix the permissions) "
        "and import the file again."
    ) % {"error": exc.strerror or exc, "path": exc.filename or settings.MEDIA_ROOT}


def _save_report(job: ImportJob, report: Path) -> str:
    if not report.is_file():
        return ""
    return _store(report, f"{_team_prefix(job.team)}/imports/{job.pk}/report.jsonl")


def _import_finish(job: ImportJob, status: str, **fields) -> ImportJob:
    ImportJob.objects.filter(pk=job.pk).update(status=status, finished_at=timezone.now(), **fields)
    job.refresh_from_db()
    return job


def _import_failed(job: ImportJob, message: str, report: Path) -> ImportJob:
    return _import_finish(
        job, ImportJob.Status.FAILED, error=message, report_file=_save_report(job, report)
    )


def _import_succeeded(job: ImportJob, result: pipeline.ImportResult) -> ImportJob:
    done = {
        "report_file": _save_report(job, result.report_path),
        "rows_read": result.rows + result.rejected,
        "bytes_read": job.bytes_total,
    }
    identical = job.dataset.versions.filter(content_hash=result.content_hash).first()
    if identical is not None:
        return _import_finish(job, ImportJob.Status.SUCCEEDED, identical_to=identical, **done)
    # Into storage before the version's (short) transaction: a large file moved or sent to S3
    # must not hold the database's write lock. Nothing names it until the version is made.
    data_file = _store(
        result.data_path,
        f"{_team_prefix(job.dataset.team)}/datasets/{job.dataset_id}/imports/{job.pk}/data.jsonl",
    )
    for _attempt in range(3):
        try:
            version = _version_create(job, result, done["report_file"], data_file)
            break
        except IntegrityError:  # another import took the number: take the next
            continue
    else:
        default_storage.delete(data_file)
        raise RuntimeError("could not number the new version")
    return _import_finish(job, ImportJob.Status.SUCCEEDED, version=version, **done)


@transaction.atomic
def _version_create(
    job: ImportJob, result: pipeline.ImportResult, report_file: str, data_file: str
):
    dataset = job.dataset
    number = (dataset.versions.aggregate(n=Max("number"))["n"] or 0) + 1
    # The report and the original stay where the import and the upload put them (immutable
    # files): a version names them rather than copying them.
    original_file, lineage = "", {}
    if job.source == DatasetVersion.Source.UPLOAD:
        original_file = job.upload.storage_name
        lineage = {"upload": str(job.upload.pk), "sha256": job.upload.sha256}
        parent = dataset.versions.order_by("-number").first()
    elif job.source == DatasetVersion.Source.LABELING:
        parent = DatasetVersion.objects.get(pk=job.parents[0])
        lineage = {
            "labeling_project": job.options["export"]["project"],
            "rule": job.options["export"]["rule"],
        }
    else:
        parents = list(DatasetVersion.objects.filter(pk__in=job.parents).order_by("number"))
        lineage = {"merged": [{"id": v.pk, "number": v.number} for v in parents]}
        parent = parents[0]
    version = DatasetVersion.objects.create(
        dataset=dataset,
        number=number,
        parent=parent,
        source=job.source,
        lineage={**lineage, "import_job": job.pk},
        created_by=job.created_by,
        content_hash=result.content_hash,
        format=job.format,
        encoding=job.encoding,
        original_name=job.upload.filename if job.upload else "",
        options=job.options,
        row_count=result.rows,
        rejected_count=result.rejected,
        duplicate_count=result.duplicates,
        split_counts=result.split_counts,
        stats=result.stats,
        errors_by_reason=result.errors_by_reason,
        page_index=result.page_index,
        data_file=data_file,
        report_file=report_file,
        original_file=original_file,
    )
    audit_record(
        action="dataset_version.create",
        actor=job.created_by,
        team=dataset.team,
        target=version,
        data={"rows": result.rows, "rejected": result.rejected, "source": job.source},
    )
    return version


# -- Labeling projects -----------------------------------------------------------------------

PUSH_BATCH = 1000


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
    labels = _clean_labels(labels) or list(dataset.labels) or list(version.stats.get("labels", {}))
    if not labels and not schema_for(dataset.task_kind).generative:
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
    schema = schema_for(version.dataset.task_kind)
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
    schema = schema_for(version.dataset.task_kind)
    ls = client(project.team)
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
        project.ls_project_id = created.id
        labeling_project_webhook_register(project)
    done = set(project.tasks.values_list("row", flat=True))
    model_version = f"{version.dataset.name} v{version.number}"
    batch: list[tuple[int, dict]] = []
    total = 0

    def flush() -> None:
        tasks = []
        for number, row in batch:
            task = {"data": {**schema.ls_data(row), "platform_row": number}}
            result = schema.ls_result(row)
            if result:  # existing labels are for review, not ground truth
                task["predictions"] = [{"model_version": model_version, "result": result}]
            tasks.append(task)
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


def labeling_project_problem(project_id: int, error: str, *, final: bool) -> None:
    """Say on the project what went wrong; ``final`` when no retry follows."""
    changes = {"error": error}
    if final:
        changes["status"] = LabelingProject.Status.FAILED
    LabelingProject.objects.filter(pk=project_id).update(**changes)


# -- Sync with Label Studio ------------------------------------------------------------------


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
    if project.webhook_url != _webhook_url(project):
        # Registered before PLATFORM_URL (or the webhook's route) changed: its calls go nowhere.
        # A hint only: if Label Studio refuses it, the sync goes on and the next one tries again.
        try:
            labeling_project_webhook_register(project)
        except Exception:
            logger.warning(
                "webhook of labeling project %s not registered", project.pk, exc_info=True
            )
    schema = schema_for(project.source_version.dataset.task_kind)
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
    return counts


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


def labeling_project_reject_outsiders(project: LabelingProject) -> int:
    """Mark the annotations that do not count, with the reason, and clear the mark of those
    that count again (a member added back). Decided from the memberships of now, at every sync
    and before every export. Returns how many do not count."""
    allowed = list(labeling_project_annotators(project))
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
    url = _webhook_url(project)
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


def _webhook_url(project: LabelingProject) -> str:
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


# -- Label Studio accounts: who is in which team's organisation ------------------------------


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


def labeling_projects_to_reconcile() -> list[int]:
    return list(
        LabelingProject.objects.filter(status=LabelingProject.Status.READY).values_list(
            "pk", flat=True
        )
    )


def labeling_project_sync_request(project: LabelingProject) -> None:
    """Queue a sync of the project (a webhook said something changed)."""
    from labeling.tasks import sync_labeling_project

    transaction.on_commit(lambda: sync_labeling_project.delay(project.pk))


# -- Export ----------------------------------------------------------------------------------


@transaction.atomic
def labeling_project_export(
    *, actor: AbstractBaseUser, project: LabelingProject, rule: str, reviewer: str = ""
) -> ImportJob:
    """A new version of the source version's rows with the labels agreed in Label Studio
    (conflicts resolved by ``rule``), imported like any other: checked, split kept."""
    if rule not in consensus.RULES:
        raise ValidationError(_("Unknown conflict rule “%(rule)s”.") % {"rule": rule})
    if rule == "reviewer" and not reviewer:
        raise ValidationError(_("Name the reviewer whose choice wins."))
    version = project.source_version
    dataset = version.dataset
    options = {
        "mapping": {f: f for f in schema_for(dataset.task_kind).field_names()},
        "drop_duplicates": False,
        "ratios": version.options.get("ratios") or [0.8, 0.1, 0.1],
        "seed": version.options.get("seed", 42),
    }
    parsed = _import_options(dataset, options)
    # The annotations were checked against the project's labels, which may differ from the
    # dataset's; the rows keep the splits they have.
    parsed = dataclasses.replace(parsed, keep_splits=True, labels=None)
    return _import_job_queue(
        actor=actor,
        dataset=dataset,
        audit=("labeling_project.export", project, {"rule": rule, "reviewer": reviewer}),
        source=DatasetVersion.Source.LABELING,
        parents=[version.pk],
        format="jsonl",
        encoding="utf-8",
        options={
            **parsed.as_dict(),
            "export": {"project": project.pk, "rule": rule, "reviewer": reviewer},
        },
        bytes_total=default_storage.size(version.data_file),
    )


def _labeling_input(job: ImportJob, workdir: Path) -> Path:
    """The source version's rows, with the resolved annotations of the project's tasks."""
    export = job.options["export"]
    project = LabelingProject.objects.select_related("source_version__dataset").get(
        pk=export["project"]
    )
    # Who counts is decided by the memberships of now, not of the last sync.
    labeling_project_reject_outsiders(project)
    answers = selectors.labeling_project_answers(project)
    path = workdir / "labeled-input.jsonl"
    with (
        default_storage.open(project.source_version.data_file, "rb") as f,
        open(path, "w", encoding="utf-8") as out,
    ):
        for number, line in enumerate(f, start=1):
            row = json.loads(line)
            if number in answers:
                agreed = consensus.resolve(answers[number], export["rule"], export["reviewer"])
                if agreed is None:
                    continue  # annotators disagree and the rule drops the row
                row.update(agreed)  # the annotated fields only
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


# -- Pre-annotation (the active-learning hook the deployment app calls) ----------------------


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
    schema = schema_for(project.source_version.dataset.task_kind)
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


def labeling_projects_to_push() -> list[int]:
    """Projects whose push gave up (Label Studio was down too long): pushed again."""
    return list(
        LabelingProject.objects.filter(status=LabelingProject.Status.FAILED).values_list(
            "pk", flat=True
        )
    )


@transaction.atomic
def labeling_project_set_labels(
    *, actor: AbstractBaseUser, project: LabelingProject, labels: Iterable[str]
) -> LabelingProject:
    """Change the label set; only before the first annotation (later it would silently
    invalidate work done)."""
    from labeling.label_studio import client

    labels = _clean_labels(labels)
    if not labels:
        raise ValidationError(_("Give the labels the annotators choose from."))
    if project.annotations.exists():
        raise ValidationError(_("The labels are fixed once the first annotation exists."))
    if project.ls_project_id is not None:
        ls = client(project.team)
        if ls.projects.get(id=project.ls_project_id).total_annotations_number:
            raise ValidationError(_("The labels are fixed once the first annotation exists."))
        schema = schema_for(project.source_version.dataset.task_kind)
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
