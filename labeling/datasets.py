"""Datasets and their uploads: a dataset created and deleted; a file uploaded in chunks (resumable,
as in the tus protocol) into the platform's storage, and abandoned uploads expired. Also where the
app's files go in storage (``team_prefix``, ``store``), which imports share."""

import contextlib
import errno
import fcntl
import hashlib
import logging
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files import File
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone
from django.utils.translation import gettext as _

from console.models import Team
from console.quotas import team_storage_check
from console.services import audit_record
from labeling import task_kinds
from labeling.models import Dataset, DatasetVersion, ImportJob, Upload
from labeling.normalize import Normalizer
from labeling.task_kinds.base import RowError, clean_label

logger = logging.getLogger(__name__)


# -- Storage -----------------------------------------------------------------------------------


def team_prefix(team: Team) -> str:
    """Where a team's files lie in storage."""
    return f"teams/{team.pk}"


class _LocalFile(File):
    """A local file that storage may move into place instead of copying (FileSystemStorage
    renames a file that has a temporary_file_path; S3 storage streams it)."""

    def temporary_file_path(self) -> str:
        return self.file.name


# A full, read-only or forbidden disk: the platform's storage, not the user's file, is at fault.
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


def store(path: Path, name: str) -> str:
    """Move the local file ``path`` into storage as ``name`` (or a free name beside it); the
    name it got."""
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


# -- Datasets ----------------------------------------------------------------------------------


def clean_labels(labels: Iterable[str], task_kind: str) -> list[str]:
    """The labels a user gave for a dataset or a labeling project, checked and normalised as an
    imported row's (``clean_label``), each once, in their order; ValidationError for a label
    that would be a row error, or for more than the kind takes."""
    limit = task_kinds.get(task_kind).max_labels
    cleaned: list[str] = []
    seen: set[str] = set()
    norm = Normalizer()
    for value in labels:
        try:  # the checks of an imported row's label
            label = clean_label(value, "labels", norm, None)
        except RowError as error:
            raise ValidationError(error.message) from None
        if not label or label in seen:
            continue
        if len(cleaned) == limit:
            raise ValidationError(
                _("More than %(max)d labels: a dataset of this kind takes at most %(max)d.")
                % {"max": limit}
            )
        seen.add(label)
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
    if task_kind not in task_kinds.KINDS:
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
        labels=clean_labels(labels, task_kind),
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


# -- Chunked uploads ---------------------------------------------------------------------------


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
    name = store(path, f"{team_prefix(upload.team)}/uploads/{upload.pk}")
    Upload.objects.filter(pk=upload.pk).update(
        status=Upload.Status.COMPLETE, storage_name=name, sha256=digest.hexdigest()
    )
    upload.refresh_from_db()
    return upload
