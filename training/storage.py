"""Files of the training app in Django's storage (filesystem or S3): base models and model
versions are directories stored under a prefix; the runner gets local copies."""

import hashlib
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from django.core.exceptions import ValidationError
from django.core.files import File
from django.core.files.storage import default_storage
from django.utils.translation import gettext as _

MODEL_EXPORT = "export/"  # where a model version's export lies under its storage prefix
MODEL_TARGETS = "targets/"  # and its other export targets (runtime.targets), a folder each


def store_dir(local: Path, prefix: str) -> dict[str, dict]:
    """Copy every file under ``local`` into storage at ``prefix``; {relative path: sha256, size}."""
    files: dict[str, dict] = {}
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        rel = path.relative_to(local).as_posix()
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
            f.seek(0)
            saved = default_storage.save(prefix + rel, File(f, name=path.name))
        if saved != prefix + rel:
            raise RuntimeError(f"storage renamed {prefix + rel} to {saved}")
        files[rel] = {"sha256": digest.hexdigest(), "size": path.stat().st_size}
    return files


def fetch_dir(
    prefix: str, files: dict[str, dict], local: Path, progress: Callable[[], None] | None = None
) -> None:
    """Copy stored files to ``local``, checking each sha256; ``progress`` is called after every
    megabyte (a job's heartbeat while it fetches a large base model)."""
    for rel, meta in files.items():
        target = local / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with default_storage.open(prefix + rel, "rb") as src, open(target, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                digest.update(block)
                dst.write(block)
                if progress:
                    progress()
        if digest.hexdigest() != meta["sha256"]:
            raise ValueError(f"{rel} in storage does not match its sha256: the file is damaged")


def dir_size(directory: Path) -> int:
    """The bytes of the files under ``directory``: what storing it takes of a team's quota."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def delete_prefix(prefix: str, files: dict[str, dict]) -> None:
    for rel in files:
        default_storage.delete(prefix + rel)


def _safe_member(name: str) -> bool:
    path = PurePosixPath(name)
    return not path.is_absolute() and ".." not in path.parts


# Members smaller than this are not held to the compression ratio (a small config of zeros).
RATIO_GRACE_BYTES = 1 << 20


class _Limits:
    """Counts an archive's members as they are listed, refusing it as soon as it holds too
    many, expands too far, or expands too many times its packed size (settings
    ARCHIVE_MAX_*), so a bomb is refused before anything is written."""

    def __init__(self, archive: Path) -> None:
        from django.conf import settings

        self.members = self.total = 0
        self.packed = max(archive.stat().st_size, 1)
        self.max_members = settings.ARCHIVE_MAX_MEMBERS
        self.max_total = settings.ARCHIVE_MAX_UNCOMPRESSED_BYTES
        self.ratio = settings.ARCHIVE_MAX_COMPRESSION_RATIO

    def add(self, name: str, size: int, packed: int | None = None) -> None:
        if not _safe_member(name):
            raise ValidationError(
                _("The archive has a path outside itself: %(name)s") % {"name": name}
            )
        self.members += 1
        self.total += size
        if self.members > self.max_members:
            raise ValidationError(
                _(
                    "The archive holds more than %(n)d files, the limit of this platform "
                    "(PLATFORM_ARCHIVE_MAX_MEMBERS)."
                )
                % {"n": self.max_members}
            )
        if self.total > self.max_total:
            raise ValidationError(
                _(
                    "The archive expands to more than %(limit)d MB, the limit of this platform "
                    "(PLATFORM_ARCHIVE_MAX_UNCOMPRESSED_MB)."
                )
                % {"limit": self.max_total // 2**20}
            )
        member_bomb = (
            packed is not None and size > RATIO_GRACE_BYTES and size > max(packed, 1) * self.ratio
        )
        if member_bomb or (
            self.total > RATIO_GRACE_BYTES and self.total > self.packed * self.ratio
        ):
            raise ValidationError(
                _(
                    "The archive expands more than %(ratio)d times its size at “%(name)s”: "
                    "refused as a possible zip bomb (PLATFORM_ARCHIVE_MAX_COMPRESSION_RATIO)."
                )
                % {"ratio": self.ratio, "name": name}
            )


def _link_refused(name: str) -> ValidationError:
    return ValidationError(
        _("The archive holds a link or a special file, which is refused: %(name)s") % {"name": name}
    )


def extract_archive(archive: Path, dest: Path) -> Path:
    """Extract a .tar(.gz) or .zip into ``dest``, refusing members that would land outside it
    (absolute paths, ``..``), links and special files, and archives past the limits of
    ``_Limits``; return the directory that holds the files (the one folder inside when the
    archive wraps everything in one)."""
    try:
        limits = _Limits(archive)
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    if stat.S_ISLNK(info.external_attr >> 16):
                        raise _link_refused(info.filename)
                    limits.add(info.filename, info.file_size, info.compress_size)
                zf.extractall(dest)  # noqa: S202 - every name checked above
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                members = []
                while (member := tf.next()) is not None:
                    if not (member.isreg() or member.isdir()):
                        raise _link_refused(member.name)
                    limits.add(member.name, member.size)
                    members.append(member)
                # The "data" filter also refuses absolute paths, "..", and device files.
                tf.extractall(dest, members=members, filter="data")
        else:
            raise ValidationError(_("The file is neither a .tar, .tar.gz nor a .zip archive."))
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise ValidationError(_("The archive cannot be read: %(error)s") % {"error": exc}) from exc
    entries = [p for p in dest.iterdir() if not p.name.startswith((".", "__MACOSX"))]
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return dest
