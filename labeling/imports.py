"""Import jobs: an uploaded file, a merge of versions or a labeling project's export becomes a new
immutable dataset version. A job is queued at commit, run by the worker (``import_run``, through
``labeling.pipeline``) and numbered; a file whose content a version already has makes none."""

import json
import tempfile
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from console.notifications import notify
from console.services import audit_record
from labeling import consensus, pipeline, selectors, task_kinds
from labeling.datasets import STORAGE_ERRNOS, store, team_prefix
from labeling.models import Dataset, DatasetVersion, ImportJob, LabelingProject, Upload
from labeling.projects import labeling_project_reject_outsiders
from labeling.readers import ENCODINGS, FORMATS, FileError


def import_options(dataset: Dataset, options: dict) -> pipeline.ImportOptions:
    schema = task_kinds.get(dataset.task_kind)
    mapping = {k: v for k, v in (options.get("mapping") or {}).items() if v}
    unknown = sorted(set(mapping) - set(schema.field_names()))
    if unknown:
        raise ValidationError(
            _("Unknown field(s) for %(kind)s: %(fields)s.")
            % {"kind": dataset.task_kind, "fields": ", ".join(unknown)}
        )
    ratios = tuple(float(r) for r in options.get("ratios") or pipeline.DEFAULT_RATIOS)
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
    parsed = import_options(dataset, options)
    return import_job_queue(
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
    schema = task_kinds.get(dataset.task_kind)
    options = {**options, "mapping": {f: f for f in schema.field_names()}}
    parsed = import_options(dataset, options)
    return import_job_queue(
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


def import_job_queue(
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


# -- Inputs ------------------------------------------------------------------------------------


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


# -- Running a job -----------------------------------------------------------------------------


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
                    schema=task_kinds.get(dataset.task_kind),
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
    return store(report, f"{team_prefix(job.team)}/imports/{job.pk}/report.jsonl")


def _import_finish(job: ImportJob, status: str, **fields) -> ImportJob:
    ImportJob.objects.filter(pk=job.pk).update(status=status, finished_at=timezone.now(), **fields)
    job.refresh_from_db()
    return job


def _import_failed(job: ImportJob, message: str, report: Path) -> ImportJob:
    job = _import_finish(
        job, ImportJob.Status.FAILED, error=message, report_file=_save_report(job, report)
    )
    notify(
        job.team,
        "import_failed",
        _("The import into %(dataset)s failed") % {"dataset": job.dataset.name},
        body=message[:1000],
        link=reverse("labeling:dataset", args=[job.team.slug, job.dataset_id]),
        subject=f"import:{job.pk}",
    )
    return job


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
    data_file = store(
        result.data_path,
        f"{team_prefix(job.dataset.team)}/datasets/{job.dataset_id}/imports/{job.pk}/data.jsonl",
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
