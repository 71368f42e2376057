"""Backups of an installation and their restore (``manage.py platform_backup``,
``manage.py platform_restore``; nightly by beat where ``BACKUP_DIR`` is set).

One archive (tar) holds:

- ``database/``: the platform's database: ``pg_dump`` (custom format: a consistent snapshot,
  taken while the platform runs) for PostgreSQL, SQLite's online backup API for SQLite;
- ``storage/``: every object of the platform's storage (uploads, dataset versions, base
  models, model versions, exports), copied after the database's snapshot: every object the
  snapshot names was stored before its row was written (objects are never changed in place);
- ``label-studio/``: the Label Studio this platform runs (``LABEL_STUDIO_DATA_DIR``): its SQLite
  database by the backup API and its files; a Label Studio of the site's own
  (``LABEL_STUDIO_URL`` without that directory) is the site's to back up;
- ``keys/``: ``SECRET_KEY``, ``SERVING_SECRET`` and the Label Studio token file: sealed
  notification channels, sessions and the serving hosts need them (the archive is as secret
  as the installation: it is written 0600);
- ``manifest.json``: when, the database's engine and migrations, every member's size and
  sha256 (checked by the restore before anything is written).

A restore goes into an empty installation (a database with no tables, a data directory with
no stored objects) and is followed by ``manage.py migrate``, so an archive of an older version
restores into a newer one.
"""

import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import IO

from django.conf import settings
from django.core.files.base import File
from django.core.files.storage import default_storage
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

MANIFEST = "manifest.json"
FORMAT = 1
ARCHIVE_PREFIX = "platform-backup-"


class BackupError(Exception):
    pass


class _Hashing:
    """A file object that hashes what is read through it."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.sha256, self.size = f, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha256.update(data)
        self.size += len(data)
        return data


def _storage_names(directory: str = "") -> Iterator[str]:
    dirs, files = default_storage.listdir(directory)
    for name in sorted(files):
        yield f"{directory}/{name}" if directory else name
    for sub in sorted(dirs):
        yield from _storage_names(f"{directory}/{sub}" if directory else sub)


def _db() -> dict:
    return settings.DATABASES["default"]


def _pg_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BackupError(f"{name} is not on the PATH: install PostgreSQL's client tools")
    return path


def _pg_env(db: dict) -> dict[str, str]:
    env = {**os.environ}
    for key, var in (("HOST", "PGHOST"), ("PORT", "PGPORT"), ("USER", "PGUSER")):
        if db.get(key):
            env[var] = str(db[key])
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = str(db["PASSWORD"])
    return env


def _dump_database(dest: Path) -> str:
    """The database into ``dest`` (a file); its engine's name."""
    db = _db()
    if db["ENGINE"].endswith("sqlite3"):
        source = sqlite3.connect(str(db["NAME"]))
        target = sqlite3.connect(str(dest))
        try:
            source.backup(target)  # consistent while others write
        finally:
            target.close()
            source.close()
        return "sqlite"
    if db["ENGINE"].endswith("postgresql"):
        done = subprocess.run(
            [_pg_tool("pg_dump"), "--format=custom", "--no-owner", "--file", str(dest), db["NAME"]],
            env=_pg_env(db),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise BackupError(f"pg_dump failed: {done.stderr.strip()[-2000:]}")
        return "postgresql"
    raise BackupError(f"backups support SQLite and PostgreSQL, not {db['ENGINE']}")


class _Writer:
    """Members added to the tar, each hashed into the manifest."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar, self.files = tar, {}

    def add(self, name: str, f: IO[bytes], size: int) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = size, 0o600, int(timezone.now().timestamp())
        hashing = _Hashing(f)
        self.tar.addfile(info, hashing)
        if hashing.size != size:
            raise BackupError(f"{name} changed while it was copied")
        self.files[name] = {"size": size, "sha256": hashing.sha256.hexdigest()}

    def add_path(self, name: str, path: Path) -> None:
        with open(path, "rb") as f:
            self.add(name, f, path.stat().st_size)

    def add_bytes(self, name: str, data: bytes) -> None:
        self.add(name, io.BytesIO(data), len(data))


def _label_studio_dir() -> Path | None:
    """The Label Studio data directory this platform runs, if there is one here."""
    directory = Path(settings.LABEL_STUDIO_DATA_DIR)
    return directory if (directory / "label_studio.sqlite3").is_file() else None


def backup_create(directory: Path) -> Path:
    """One archive of the installation in ``directory`` (written aside, then renamed); its
    path."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = timezone.localtime().strftime("%Y%m%d-%H%M%S")
    final = directory / f"{ARCHIVE_PREFIX}{stamp}.tar"
    partial = directory / f".{final.name}.partial"
    with tempfile.TemporaryDirectory(prefix="backup-") as tmp:
        dump = Path(tmp) / "database"
        engine = _dump_database(dump)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w") as tar:
            writer = _Writer(tar)
            writer.add_path(f"database/{engine}.dump", dump)
            dump.unlink()
            for name in _storage_names():
                with default_storage.open(name, "rb") as f:
                    writer.add(f"storage/{name}", f, default_storage.size(name))
            ls_dir = _label_studio_dir()
            if ls_dir is not None:
                ls_db = Path(tmp) / "label_studio.sqlite3"
                source, target = sqlite3.connect(ls_dir / "label_studio.sqlite3"), None
                try:
                    target = sqlite3.connect(ls_db)
                    source.backup(target)
                finally:
                    source.close()
                    if target is not None:
                        target.close()
                writer.add_path("label-studio/label_studio.sqlite3", ls_db)
                for path in sorted(p for p in ls_dir.rglob("*") if p.is_file()):
                    rel = path.relative_to(ls_dir).as_posix()
                    if not rel.startswith("label_studio.sqlite3") and not path.is_symlink():
                        writer.add_path(f"label-studio/{rel}", path)
            writer.add_bytes("keys/secret_key", settings.SECRET_KEY.encode())
            writer.add_bytes("keys/serving_secret", settings.SERVING_SECRET.encode())
            token = Path(settings.LABEL_STUDIO_TOKEN_FILE)
            if token.is_file():
                writer.add_path("keys/label_studio_token", token)
            migrations = sorted(
                f"{app}.{name}"
                for app, name in MigrationRecorder.Migration.objects.values_list("app", "name")
            )
            manifest = {
                "format": FORMAT,
                "created_at": timezone.now().isoformat(),
                "database": engine,
                "migrations": migrations,
                "label_studio": ls_dir is not None,
                "files": writer.files,
            }
            data = json.dumps(manifest, ensure_ascii=False, indent=1).encode()
            writer.add_bytes(MANIFEST, data)
    partial.rename(final)
    return final


def backups_prune(directory: Path, keep: int) -> list[Path]:
    """The newest ``keep`` archives stay; the others are deleted (and returned)."""
    archives = sorted(directory.glob(f"{ARCHIVE_PREFIX}*.tar"), reverse=True)
    for old in archives[keep:]:
        old.unlink()
    return archives[keep:]


def last_backup_at(directory: Path) -> datetime | None:
    archives = sorted(directory.glob(f"{ARCHIVE_PREFIX}*.tar"), reverse=True)
    if not archives:
        return None
    return datetime.fromtimestamp(archives[0].stat().st_mtime, tz=timezone.get_current_timezone())


# -- Restore ----------------------------------------------------------------------------------


def _safe(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise BackupError(f"the archive holds an unsafe member name: {name!r}")
    return path


def _manifest(archive: Path) -> dict:
    with tarfile.open(archive, mode="r") as tar:
        try:
            member = tar.getmember(MANIFEST)
        except KeyError:
            raise BackupError(f"{archive} is not a platform backup: no {MANIFEST}") from None
        f = tar.extractfile(member)
        if f is None:
            raise BackupError(f"{MANIFEST} of {archive} is not a file")
        manifest = json.loads(f.read())
    if manifest.get("format") != FORMAT:
        raise BackupError(f"unknown backup format {manifest.get('format')!r}")
    return manifest


def backup_verify(archive: Path) -> dict:
    """Every member's size and sha256 as the manifest says (before anything is restored)."""
    manifest = _manifest(archive)
    seen = set()
    with tarfile.open(archive, mode="r") as tar:
        for member in tar:
            if member.name == MANIFEST:
                continue
            _safe(member.name)
            if not member.isfile():
                raise BackupError(f"{member.name} is not a plain file")
            expected = manifest["files"].get(member.name)
            f = tar.extractfile(member)
            if expected is None or f is None:
                raise BackupError(f"{member.name} is not in the manifest")
            hashing = _Hashing(f)
            while hashing.read(1 << 20):
                pass
            if (hashing.size, hashing.sha256.hexdigest()) != (
                expected["size"],
                expected["sha256"],
            ):
                raise BackupError(
                    f"{member.name} does not match its sha256: the archive is damaged"
                )
            seen.add(member.name)
    if missing := set(manifest["files"]) - seen:
        raise BackupError(f"the archive lacks {len(missing)} files, e.g. {sorted(missing)[0]}")
    return manifest


def _check_empty() -> None:
    if connection.introspection.table_names():
        raise BackupError(
            "the database is not empty: restore into a new, empty database (see the "
            "operator's guide, Backup and restore)"
        )
    try:
        dirs, files = default_storage.listdir("")
    except FileNotFoundError:  # a data directory not made yet
        dirs, files = [], []
    if dirs or files:
        raise BackupError("the storage is not empty: restore into a new data directory")


def _restore_database(engine: str, dump: Path) -> None:
    db = _db()
    if engine == "sqlite" and db["ENGINE"].endswith("sqlite3"):
        connection.close()
        target = Path(db["NAME"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(dump, target)
        target.chmod(0o600)
        return
    if engine == "postgresql" and db["ENGINE"].endswith("postgresql"):
        connection.close()
        done = subprocess.run(
            [_pg_tool("pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error",
             "--dbname", db["NAME"], str(dump)],
            env=_pg_env(db),
            capture_output=True,
            text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise BackupError(f"pg_restore failed: {done.stderr.strip()[-2000:]}")
        return
    raise BackupError(
        f"the archive's database is {engine}; this installation's is {db['ENGINE']}: restore "
        "into the same kind of database"
    )


def backup_restore(archive: Path) -> dict:
    """``archive`` into this empty installation: checked whole first, then the database,
    the storage's objects, Label Studio's directory and the keys (into the data directory,
    where ``make run`` reads them). Returns the manifest."""
    manifest = backup_verify(archive)
    _check_empty()
    data_dir = Path(settings.DATA_DIR)
    ls_dir = Path(settings.LABEL_STUDIO_DATA_DIR)
    with tempfile.TemporaryDirectory(prefix="restore-") as tmp, tarfile.open(archive) as tar:
        for member in tar:
            name = _safe(member.name)
            f = tar.extractfile(member)
            if f is None or member.name == MANIFEST:
                continue
            top, rest = name.parts[0], PurePosixPath(*name.parts[1:])
            if top == "database":
                dump = Path(tmp) / "database"
                with open(dump, "wb") as out:
                    shutil.copyfileobj(f, out)
                _restore_database(manifest["database"], dump)
            elif top == "storage":
                saved = default_storage.save(str(rest), File(f, name=rest.name))
                if saved != str(rest):
                    raise BackupError(f"storage renamed {rest} to {saved}")
            elif top == "label-studio":
                target = ls_dir / rest
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as out:
                    shutil.copyfileobj(f, out)
            elif top == "keys":
                names = {"label_studio_token": Path(settings.LABEL_STUDIO_TOKEN_FILE)}
                target = names.get(rest.name, data_dir / rest.name)
                target.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(f, out)
    return manifest
