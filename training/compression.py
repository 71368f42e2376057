"""Compression of a model version ("train once, deploy many"), queued on a CPU train worker
like any job (progress, cancel):

- ``int8`` quantizes the version's ONNX form with ONNX Runtime (runtime.compress);
- ``distill`` trains a student (a preset, the small transformer by default, or an encoder the
  team imported as a base model) on what the version decides for its training rows and the
  dataset's unlabeled rows (runtime.distill).

Its result is a new version of the same name whose ``parent`` is the one compressed and whose
``compression`` holds the method, its parameters and the figures beside the parent
(registry.model_version_register)."""

import uuid
from dataclasses import asdict

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _

from console.selectors import live_nodes_with
from console.services import audit_record
from runtime.backends import available as available_backends
from runtime.compress import MODES
from runtime.kinds import GENERATIVE_KINDS
from runtime.presets import CPU_TRANSFORMER, presets_for
from runtime.spec import Hyperparameters
from training.jobs import _validated_hyperparameters, no_node_reason, training_job_enqueue
from training.models import BaseModel, ModelVersion, TrainingJob
from training.registry import model_version_targets
from training.selectors import team_base_models

METHODS = (TrainingJob.Objective.INT8, TrainingJob.Objective.DISTILL)
MAX_CALIBRATION_ROWS = 5000
STUDENT_BACKEND = "paddle"  # the fast presets train on it (runtime.presets.FAST_BACKENDS)
# The default student: the small transformer (2 MB, a few times faster than ERNIE tiny). The
# fast presets are faster still but their n-gram tables make them larger on disk.
DEFAULT_STUDENT = CPU_TRANSFORMER


def compression_checks(
    version: ModelVersion, method: str, mode: str, calibration_rows: int, student: str
) -> None:
    """Why ``version`` cannot be compressed so, as a ValidationError; nothing if it can."""
    if method not in METHODS:
        raise ValidationError(
            _("Unknown compression “%(m)s”: %(all)s.") % {"m": method, "all": ", ".join(METHODS)}
        )
    if version.task_kind in GENERATIVE_KINDS:
        raise ValidationError(_("Large language models are not compressed here."))
    if version.dataset_version is None:
        raise ValidationError(
            _("%(v)s was imported: it has no dataset here to evaluate a compressed model on.")
            % {"v": version}
        )
    if method == TrainingJob.Objective.DISTILL:
        student_of(version, student)
        return
    if version.manifest.get("quantization"):
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


def student_of(version: ModelVersion, student: str) -> tuple[str, BaseModel | None]:
    """The student ``student`` names for ``version``: a paddle preset of its kind (preset, None)
    or an encoder the team (or the site) imported as a base model ("", the model); a
    ValidationError listing both otherwise."""
    presets = presets_for(version.task_kind, STUDENT_BACKEND)
    if student in presets:
        return student, None
    encoders = student_base_models(version.team)
    model = next((m for m in encoders if m.name == student), None)
    if model is None:
        raise ValidationError(
            _(
                "No student named “%(p)s” for %(kind)s: a preset (%(all)s) or an encoder "
                "imported as a base model (%(bases)s)."
            )
            % {
                "p": student,
                "kind": version.task_kind,
                "all": ", ".join(presets),
                "bases": ", ".join(m.name for m in encoders) or _("none"),
            }
        )
    return "", model


def student_base_models(team) -> list[BaseModel]:
    """The imported encoders a version of the team can be distilled into (the team's own and
    the site's shared ones; a causal LM is no classifier's student)."""
    return [
        m
        for m in team_base_models(team).order_by("name")
        if not m.summary.get("causal_lm") and m.backend in available_backends()
    ]


def compression_submit(
    *,
    actor: AbstractBaseUser,
    version: ModelVersion,
    method: str = TrainingJob.Objective.INT8,
    mode: str = "dynamic",
    calibration_rows: int = 200,
    student: str = "",
    hyperparameters: dict | None = None,
) -> TrainingJob:
    """Queue the compression of ``version`` (found in the actor's team by a selector) on a
    CPU train worker: INT8 quantization, or distillation into ``student`` (by default the
    small transformer, ``DEFAULT_STUDENT``). ``hyperparameters``: the student's, over the ones
    recommended for it (a distillation's only: quantization trains nothing)."""
    team = version.team
    student = student or DEFAULT_STUDENT
    compression_checks(version, method, mode, calibration_rows, student)
    if hyperparameters and method != TrainingJob.Objective.DISTILL:
        raise ValidationError(
            _("Hyperparameters are a student's: INT8 quantization trains nothing.")
        )
    base_model = None
    known = Hyperparameters.__dataclass_fields__
    if method == TrainingJob.Objective.INT8:
        given = {**version.hyperparameters, "quantization": mode}
        given["calibration_rows"] = calibration_rows
        hp = Hyperparameters.from_dict({k: v for k, v in given.items() if k in known})
        preset, name, backend = "", f"{version} INT8", version.backend
        data = {"method": method, "mode": mode}
    else:
        preset, base_model = student_of(version, student)
        # The teacher's max_seq_length unless given; the rest as recommended for the student.
        given = {k: v for k, v in version.hyperparameters.items() if k == "max_seq_length"}
        hp = _validated_hyperparameters(
            version.task_kind, preset or None, {**given, **(hyperparameters or {})}
        )
        backend = base_model.backend if base_model else STUDENT_BACKEND
        name = f"{version} → {student}"
        data = {"method": method, "student": student}
    with transaction.atomic():
        job = TrainingJob.objects.create(
            team=team,
            name=name[:100],
            dataset_version=version.dataset_version,
            task_kind=version.task_kind,
            labels=list(version.labels),
            preset=preset,
            base_model=base_model,
            backend=backend,
            objective=method,
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
            data={"version": str(version), **data},
        )
        transaction.on_commit(lambda: training_job_enqueue(job))
    return job


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def compression_view(version: ModelVersion) -> dict | None:
    """A compressed version beside its parent, as its page shows it: None for one that is not.
    Every figure is read as a number or left out (the runner wrote them)."""
    figures = _dict(version.compression)
    if not version.parent_id and not figures:
        return None
    before = _dict(figures.get("parent_metrics"))
    delta = _dict(figures.get("metric_delta"))
    metrics = []
    for name, value in before.items():
        was, change = _number(value), _number(delta.get(name))
        if name != "support" and was is not None and change is not None:
            metrics.append((name, was, was + change, change))
    size = _dict(figures.get("size"))
    latency = _dict(figures.get("latency"))
    distilled = figures.get("method") == TrainingJob.Objective.DISTILL
    names = {
        "parent": _("the parent, as it is served"),
        "parent_onnx": _("the parent in ONNX Runtime (FP32)"),
        "model": _("this version (the student)") if distilled else _("this version (INT8)"),
    }
    runs = []
    for key, label in names.items():
        if key not in latency and key not in size:
            continue
        entry = _dict(latency.get(key))
        runs.append(
            {
                "name": label,
                "size": _number(size.get(key)),
                "b1_ms": _number(entry.get("b1_ms")),
                "b32_rows_per_s": _number(entry.get("b32_rows_per_s")),
            }
        )
    per_label = _dict(figures.get("per_label_f1_delta"))
    return {
        "parent": version.parent,
        "method": str(figures.get("method", "")),
        "params": {str(k): str(v) for k, v in _dict(figures.get("params")).items()},
        "agreement": _number(figures.get("agreement")),
        "metrics": metrics,
        "per_label": [(str(k), _number(v)) for k, v in per_label.items() if _number(v) is not None],
        "runs": runs,
    }


def deployment_figures(versions: list[ModelVersion]) -> list[dict]:
    """What each version costs to serve, as the compare page shows it beside its metrics: how
    it was made (method, parent), its size, latency at batch 1 and throughput at batch 32, and
    the share of rows it decides as its parent does. A compressed version's figures are its
    own compression's; a parent's are those its latest compressed child measured of it (on
    the same node, in the same run). None where nothing measured it."""
    figures = []
    for version in versions:
        own = _dict(version.compression)
        if own:
            key, source = "model", own
        else:
            children = [c for c in version.children.order_by("pk") if _dict(c.compression)]
            key, source = "parent", _dict(children[-1].compression) if children else {}
        latency = _dict(_dict(source.get("latency")).get(key))
        figures.append(
            {
                "method": str(own.get("method", "")),
                "parent": version.parent if version.parent_id else None,
                "size": _number(_dict(source.get("size")).get(key)),
                "b1_ms": _number(latency.get("b1_ms")),
                "b32_rows_per_s": _number(latency.get("b32_rows_per_s")),
                "agreement": _number(own.get("agreement")),
            }
        )
    return figures


def family_ids(version: ModelVersion) -> list[int]:
    """The version, what it was compressed from and every other version compressed from that
    one, oldest first: the versions its page offers to compare."""
    root = version.parent if version.parent_id and version.parent else version
    children = root.children.filter(team=root.team).order_by("pk")
    ids = [root.pk, *children.values_list("pk", flat=True)]
    return ids if len(ids) > 1 else []
