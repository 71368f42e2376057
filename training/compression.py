"""Compression of a model version ("train once, deploy many"): a job of objective "int8",
queued on a CPU train worker like any job (progress, cancel), that quantizes the version's
ONNX form with ONNX Runtime (runtime.compress). Its result is a new version of the same name
whose ``parent`` is the one compressed and whose ``compression`` holds the method, its
parameters and the figures beside the parent (registry.model_version_register)."""

import uuid
from dataclasses import asdict

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _

from console.selectors import live_nodes_with
from console.services import audit_record
from runtime.compress import MODES
from runtime.kinds import GENERATIVE_KINDS
from runtime.spec import Hyperparameters
from training.jobs import no_node_reason, training_job_enqueue
from training.models import ModelVersion, TrainingJob
from training.registry import model_version_targets

MAX_CALIBRATION_ROWS = 5000


def compression_checks(version: ModelVersion, mode: str, calibration_rows: int) -> None:
    """Why ``version`` cannot be compressed so, as a ValidationError; nothing if it can."""
    if version.task_kind in GENERATIVE_KINDS:
        raise ValidationError(_("Large language models are not compressed here."))
    if version.dataset_version is None:
        raise ValidationError(
            _("%(v)s was imported: it has no dataset here to evaluate a compressed model on.")
            % {"v": version}
        )
    if version.parent_id or version.manifest.get("quantization"):
        raise ValidationError(_("%(v)s is compressed already.") % {"v": version})
    onnx = [t for t in model_version_targets(version) if t["name"] == "onnx"]
    if not onnx or onnx[0]["status"] != "ready":
        raise ValidationError(
            _("%(v)s has no ONNX form to quantize (see its export targets).") % {"v": version}
        )
    if mode not in MODES:
        raise ValidationError(
            _("Unknown quantization “%(m)s”: %(all)s.") % {"m": mode, "all": ", ".join(MODES)}
        )
    if not 1 <= calibration_rows <= MAX_CALIBRATION_ROWS:
        raise ValidationError(
            _("Calibration rows must be between 1 and %(n)d.") % {"n": MAX_CALIBRATION_ROWS}
        )
    if mode == "static" and not version.dataset_version.split_counts.get("dev"):
        raise ValidationError(
            _("Static quantization calibrates on the dev split: %(v)s has none.")
            % {"v": version.dataset_version}
        )


def compression_submit(
    *,
    actor: AbstractBaseUser,
    version: ModelVersion,
    mode: str = "dynamic",
    calibration_rows: int = 200,
) -> TrainingJob:
    """Queue the INT8 compression of ``version`` (found in the actor's team by a selector) on
    a CPU train worker."""
    team = version.team
    compression_checks(version, mode, calibration_rows)
    given = {**version.hyperparameters, "quantization": mode, "calibration_rows": calibration_rows}
    known = Hyperparameters.__dataclass_fields__
    hp = Hyperparameters.from_dict({k: v for k, v in given.items() if k in known})
    with transaction.atomic():
        job = TrainingJob.objects.create(
            team=team,
            name=f"{version} INT8"[:100],
            dataset_version=version.dataset_version,
            task_kind=version.task_kind,
            labels=list(version.labels),
            backend=version.backend,
            objective=TrainingJob.Objective.INT8,
            parent_version=version,
            hyperparameters=asdict(hp),
            device_type="cpu",
            device_count=1,
            waiting_reason="" if live_nodes_with("cpu") else no_node_reason("cpu"),
            celery_task_id=uuid.uuid4().hex,
            created_by=actor,
        )
        audit_record(
            action="training.model_compress",
            actor=actor,
            team=team,
            target=job,
            data={"version": str(version), "method": "int8", "mode": mode},
        )
        transaction.on_commit(lambda: training_job_enqueue(job))
    return job


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def compression_view(version: ModelVersion) -> dict | None:
    """A compressed version beside its parent, as its page shows it: None for one that is not.
    Every figure is read as a number or left out (the runner wrote them)."""
    figures = version.compression or {}
    if not version.parent_id and not figures:
        return None
    before = figures.get("parent_metrics") or {}
    delta = figures.get("metric_delta") or {}
    metrics = []
    for name, value in before.items():
        was, change = _number(value), _number(delta.get(name))
        if name != "support" and was is not None and change is not None:
            metrics.append((name, was, was + change, change))
    size = figures.get("size") or {}
    sizes = {k: _number(size.get(k)) for k in ("parent", "parent_onnx", "int8")}
    latency = figures.get("latency") or {}
    runs = []
    for key, label in (
        ("parent", _("the parent, as it is served")),
        ("parent_onnx", _("the parent in ONNX Runtime (FP32)")),
        ("int8", _("this version (INT8)")),
    ):
        entry = latency.get(key) or {}
        runs.append(
            {
                "name": label,
                "size": sizes[key],
                "b1_ms": _number(entry.get("b1_ms")),
                "b32_rows_per_s": _number(entry.get("b32_rows_per_s")),
            }
        )
    per_label = figures.get("per_label_f1_delta") or {}
    return {
        "parent": version.parent,
        "method": str(figures.get("method", "")),
        "params": {str(k): str(v) for k, v in (figures.get("params") or {}).items()},
        "agreement": _number(figures.get("agreement")),
        "metrics": metrics,
        "per_label": [(str(k), _number(v)) for k, v in per_label.items() if _number(v) is not None],
        "runs": runs,
    }
