"""The model-version registry: a succeeded job's model registered (its export and best
checkpoint stored, its evaluation kept), a version written as one ``.tar.gz`` that another site
imports (every file checked against its sha256), and deleted unless an app that uses it refuses
(``model_version_delete_checks``)."""

import io
import json
import shutil
import tarfile
import tempfile
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Max
from django.utils.translation import gettext as _

from console.models import Team
from console.quotas import team_storage_check
from console.services import audit_record
from runtime.inference import MANIFEST, PATH_FIELDS, read_manifest, write_manifest
from runtime.targets import TARGET_RUNTIMES, TARGETS_DIR
from training import storage
from training.base_models import weights_to_safetensors
from training.jobs import training_job_finish
from training.models import ModelVersion, TrainingJob


def _next_number(team: Team, name: str) -> int:
    top = ModelVersion.objects.filter(team=team, name=name).aggregate(n=Max("number"))["n"]
    return (top or 0) + 1


def model_version_register(job: TrainingJob, workdir: Path) -> ModelVersion:
    """The model of a succeeded job: its export and best checkpoint into storage (first, outside
    any transaction: a large model's copy must not hold the database's write lock), then its
    row and the job's status in one short transaction."""
    manifest = read_manifest(workdir / "export")
    evaluation = json.loads((workdir / "evaluation.json").read_text(encoding="utf-8"))
    uid = uuid.uuid4()
    prefix = f"models/{uid.hex}/"
    with tempfile.TemporaryDirectory(prefix="model-") as tmp:
        staged = Path(tmp)
        # Links are copied as links (check_outputs refused them already): never their targets.
        shutil.copytree(workdir / "export", staged / "export", symlinks=True)
        shutil.copytree(workdir / "best", staged / "checkpoint", symlinks=True)
        evaluation["targets"] = _checked_targets(workdir / TARGETS_DIR, evaluation.get("targets"))
        for name, target in evaluation["targets"].items():
            if target["status"] == "ready":
                dest = staged / storage.MODEL_TARGETS / name
                shutil.copytree(workdir / TARGETS_DIR / name, dest, symlinks=True)
        files = storage.store_dir(staged, prefix)
    name = job.dataset_version.dataset.name
    with transaction.atomic():
        Team.objects.select_for_update().get(pk=job.team_id)
        version = ModelVersion.objects.create(
            uid=uid,
            team=job.team,
            name=name,
            number=_next_number(job.team, name),
            job=job,
            dataset_version=job.dataset_version,
            task_kind=job.task_kind,
            labels=list(job.labels),
            backend=job.backend,
            runtime=manifest["runtime"],
            # A quantized model is its parent's; a distilled one is its student preset.
            base=job.parent_version.base
            if job.parent_version and job.objective == TrainingJob.Objective.INT8
            else job.model_source,
            hyperparameters=job.hyperparameters,
            metrics={k: v for k, v in evaluation["metrics"].items() if isinstance(v, int | float)},
            evaluation=evaluation,
            manifest=manifest,
            storage_prefix=prefix,
            files=files,
            created_by=job.created_by,
            **_lineage(job, evaluation),
        )
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        training_job_finish(job, TrainingJob.Status.SUCCEEDED)
    return version


def _lineage(job: TrainingJob, evaluation: dict) -> dict:
    """A compression job's version: its parent and how it was made (runtime.compress's
    figures, which the model page shows beside the parent's)."""
    parent = job.parent_version
    if job.objective not in TrainingJob.COMPRESSIONS or parent is None:
        return {}
    compression = evaluation.get("compression")
    compression = compression if isinstance(compression, dict) else {}
    if job.base_model_id and isinstance(compression.get("params"), dict):
        # A base model student: the runner knows its files, not its name.
        compression["params"]["student"] = job.base_model.name
    return {"parent": parent, "compression": compression}


def _checked_targets(root: Path, reported) -> dict[str, dict]:
    """The export targets under ``root`` (``<root>/<name>``, runtime.targets) as found: a
    known target said to be ready is ready only if its manifest holds every file it names and
    the runtime it should. What a runner (another user) or another site's archive says of
    them is not taken on trust."""
    found: dict[str, dict] = {}
    reported = reported if isinstance(reported, dict) else {}
    for name, runtime in TARGET_RUNTIMES.items():
        said = reported.get(name)
        if not isinstance(said, dict):
            continue
        if said.get("status") != "ready":
            found[name] = {"status": "failed", "error": str(said.get("error", ""))[:2000]}
            continue
        try:
            manifest = read_manifest(root / name)
            if manifest.get("runtime") != runtime:
                raise ValueError(f"its manifest names the runtime {manifest.get('runtime')!r}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            found[name] = {"status": "failed", "error": f"its files do not check out: {exc}"}
            continue
        agreement = said.get("agreement")
        found[name] = {
            "status": "ready",
            "runtime": runtime,
            "agreement": float(agreement) if isinstance(agreement, int | float) else None,
        }
    return found


# The target a version's own export is, by its runtime (runtime.targets names the others).
EXPORT_TARGETS = {"paddle_inference": "paddle_inference", "onnxruntime": "onnx"}


def model_version_targets(version: ModelVersion) -> list[dict]:
    """Where the version can run: its export first, then the targets made from it, each with
    its status, runtime, size and (for a made one) how often it decided as the export did."""
    own = EXPORT_TARGETS.get(version.runtime, version.runtime)
    targets = [{"name": own, "runtime": version.runtime, "status": "ready", "agreement": None}]
    made = (version.evaluation or {}).get("targets") or {}
    targets += [{"name": name, **made[name]} for name in sorted(made) if name != own]
    for target in targets:
        prefix = _target_prefix(version, target["name"])
        target["size"] = (
            sum(m["size"] for rel, m in version.files.items() if rel.startswith(prefix))
            if prefix
            else None
        )
    return targets


def _target_prefix(version: ModelVersion, name: str) -> str | None:
    """Where target ``name`` of the version lies under its storage prefix; None if nowhere."""
    if name == EXPORT_TARGETS.get(version.runtime, version.runtime):
        return storage.MODEL_EXPORT
    made = ((version.evaluation or {}).get("targets") or {}).get(name)
    if isinstance(made, dict) and made.get("status") == "ready":
        return f"{storage.MODEL_TARGETS}{name}/"
    return None


def model_version_target_files(version: ModelVersion, name: str):
    """The files of target ``name`` of the version: (path within the target, a function that
    opens it from storage, its size); none if it has no such target."""
    prefix = _target_prefix(version, name)
    if prefix is None:
        return
    for rel, meta_file in version.files.items():
        if rel.startswith(prefix):
            path = version.storage_prefix + rel
            yield rel[len(prefix) :], partial(default_storage.open, path, "rb"), meta_file["size"]


def model_version_target_archive(version: ModelVersion, name: str, out) -> bool:
    """Write target ``name`` of the version (its folder: the manifest with every file's
    sha256, the model, the vocabulary) as one .tar.gz to ``out``; False if it has none."""
    if _target_prefix(version, name) is None:
        return False
    with tarfile.open(fileobj=out, mode="w:gz") as tf:
        for rel, opened, size in model_version_target_files(version, name):
            info = tarfile.TarInfo(rel)
            info.size = size
            with opened() as f:
                tf.addfile(info, f)
    return True


def model_version_archive(version: ModelVersion, out) -> None:
    """Write one .tar.gz of a model version to the binary file ``out``: model.json (what it is
    and where it came from), export/ and checkpoint/."""
    meta = {
        "format": 1,
        "name": version.name,
        "number": version.number,
        "task_kind": version.task_kind,
        "labels": version.labels,
        "backend": version.backend,
        "runtime": version.runtime,
        "base": version.base,
        "hyperparameters": version.hyperparameters,
        "metrics": version.metrics,
        "evaluation": version.evaluation,
        "files": version.files,
        "provenance": version.provenance
        or {
            "team": version.team.slug,
            "dataset": version.dataset_version.dataset.name if version.dataset_version else "",
            "dataset_version": version.dataset_version.number if version.dataset_version else None,
            "content_hash": version.dataset_version.content_hash if version.dataset_version else "",
            "job": version.job_id,
            "created_at": version.created_at.isoformat(),
        },
    }
    with tarfile.open(fileobj=out, mode="w:gz") as tf:
        raw = json.dumps(meta, ensure_ascii=False, indent=1).encode()
        info = tarfile.TarInfo("model.json")
        info.size = len(raw)
        tf.addfile(info, io.BytesIO(raw))
        for rel, meta_file in version.files.items():
            info = tarfile.TarInfo(rel)
            info.size = meta_file["size"]
            with default_storage.open(version.storage_prefix + rel, "rb") as f:
                tf.addfile(info, f)


def _manifest_after_conversion(export: Path, manifest: dict, converted: dict[str, str]) -> dict:
    """The export's manifest again after its pickled weights became safetensors (a version
    exported before they were): new files and hashes, the fields that named a pickle renamed."""
    renamed = {
        old.removeprefix(storage.MODEL_EXPORT): new.removeprefix(storage.MODEL_EXPORT)
        for old, new in converted.items()
        if old.startswith(storage.MODEL_EXPORT)
    }
    fields = {k: v for k, v in manifest.items() if k not in ("files", "format")}
    for key in PATH_FIELDS:
        if fields.get(key) in renamed:
            fields[key] = renamed[fields[key]]
    write_manifest(export, **fields)
    return read_manifest(export)


def model_version_import(*, actor: AbstractBaseUser, team: Team, archive) -> ModelVersion:
    """A model version from another site's archive (``model_version_archive``), checked file by
    file against its sha256."""
    with tempfile.TemporaryDirectory(prefix="model-import-") as tmp:
        tmp_path = Path(tmp)
        local = tmp_path / "model.tar.gz"
        with open(local, "wb") as f:
            for chunk in archive.chunks():
                f.write(chunk)
        root = storage.extract_archive(local, tmp_path / "x")
        try:
            meta = json.loads((root / "model.json").read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ValidationError(_("The archive has no model.json: not a model version.")) from exc
        except ValueError as exc:
            raise ValidationError(_("model.json is not valid JSON: %(e)s") % {"e": exc}) from exc
        if not (root / "export" / MANIFEST).is_file():
            raise ValidationError(_("The archive lacks export/manifest.json."))
        try:
            manifest = read_manifest(root / "export")
            converted = weights_to_safetensors(root)
            if any(old.startswith(storage.MODEL_EXPORT) for old in converted):
                manifest = _manifest_after_conversion(root / "export", manifest, converted)
        except (FileNotFoundError, ValueError) as exc:
            raise ValidationError(str(exc)) from exc
        (root / "model.json").unlink()
        evaluation = meta.get("evaluation") if isinstance(meta.get("evaluation"), dict) else {}
        evaluation["targets"] = _checked_targets(
            root / storage.MODEL_TARGETS, evaluation.get("targets")
        )
        team_storage_check(team, storage.dir_size(root))
        uid = uuid.uuid4()
        prefix = f"models/{uid.hex}/"
        files = storage.store_dir(root, prefix)
    name = str(meta.get("name") or "imported")[:100]
    with transaction.atomic():  # short: the files are stored already
        Team.objects.select_for_update().get(pk=team.pk)
        version = ModelVersion.objects.create(
            uid=uid,
            team=team,
            name=name,
            number=_next_number(team, name),
            source=ModelVersion.Source.IMPORTED,
            task_kind=manifest["task_kind"],
            labels=manifest["labels"],
            backend=manifest.get("backend", meta.get("backend", "")),
            runtime=manifest["runtime"],
            base=str(meta.get("base", "")),
            hyperparameters=meta.get("hyperparameters") or {},
            metrics=meta.get("metrics") or {},
            evaluation=evaluation,
            manifest=manifest,
            storage_prefix=prefix,
            files=files,
            provenance=meta.get("provenance") or {},
            created_by=actor,
        )
        audit_record(
            action="model.import",
            actor=actor,
            team=team,
            target=version,
            data={"from": meta.get("provenance", {}), "files": len(files)},
        )
    return version


# Checks that refuse to delete a model version still in use, registered by the apps that use
# model versions (deployment: one that serves traffic); each raises ValidationError.
model_version_delete_checks: list[Callable[[ModelVersion], None]] = []


@transaction.atomic
def model_version_delete(*, actor: AbstractBaseUser, version: ModelVersion) -> None:
    for check in model_version_delete_checks:
        check(version)
    prefix, files = version.storage_prefix, dict(version.files)
    audit_record(action="model.delete", actor=actor, team=version.team, target=version)
    version.delete()
    transaction.on_commit(lambda: storage.delete_prefix(prefix, files))
