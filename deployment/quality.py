"""The quality gate of a rollout: a candidate model version beside the one an endpoint serves,
from both versions' evaluation reports (the primary metric of the task kind and per label F1).

The figures are the training runner's (``ModelVersion.evaluation``): no model is run here. They
compare exactly when both versions were trained on the same dataset version (so evaluated on
the same test rows, ``same_split``); otherwise they are shown with that caveat. A worse
candidate is warned about, never refused: the user decides, and the audit log records it.
"""

from django.utils.translation import gettext as _

from deployment.models import Endpoint
from runtime.baselines import primary_metric
from training.models import ModelVersion

# A candidate is "worse" when its primary metric is below the serving version's by more than
# this: on a few hundred test rows a smaller difference is noise, not a regression.
WORSE_TOLERANCE = 0.005


def _figure(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _delta(serving: float | None, candidate: float | None) -> float | None:
    if serving is None or candidate is None:
        return None
    return round(candidate - serving, 6)


def _side(version: ModelVersion, metric: str) -> dict:
    evaluation = version.evaluation or {}
    metrics = evaluation.get("metrics") or {}
    return {
        "id": version.pk,
        "name": str(version),
        "dataset_version": version.dataset_version_id,
        "split": evaluation.get("split"),
        "rows": evaluation.get("rows"),
        "value": _figure(metrics.get(metric)),
    }


def _per_label_f1(version: ModelVersion) -> dict:
    per_label = ((version.evaluation or {}).get("metrics") or {}).get("per_label") or {}
    return {
        label: _figure(entry.get("f1"))
        for label, entry in per_label.items()
        if isinstance(entry, dict)
    }


def compare_versions(serving: ModelVersion, candidate: ModelVersion) -> dict | None:
    """``candidate`` beside ``serving``: ``metric`` (the task kind's primary one), ``serving``
    and ``candidate`` (id, name, dataset_version, split, rows, value), ``delta`` (candidate −
    serving), ``per_label`` ([{label, serving, candidate, delta}] of F1), ``same_split``,
    ``worse`` (the candidate's figure below the serving one's by more than ``WORSE_TOLERANCE``),
    ``tolerance`` and ``caveat`` (why the figures may not compare, or ""). None where nothing
    compares: a generative model (no primary metric) or versions of different task kinds."""
    if serving.task_kind != candidate.task_kind:
        return None
    try:
        metric = primary_metric(candidate.task_kind)
    except ValueError:
        return None
    ours, theirs = _side(serving, metric), _side(candidate, metric)
    delta = _delta(ours["value"], theirs["value"])
    same_split = (
        serving.dataset_version_id is not None
        and serving.dataset_version_id == candidate.dataset_version_id
        and ours["split"] == theirs["split"]
    )
    serving_f1, candidate_f1 = _per_label_f1(serving), _per_label_f1(candidate)
    per_label = [
        {
            "label": label,
            "serving": serving_f1.get(label),
            "candidate": candidate_f1.get(label),
            "delta": _delta(serving_f1.get(label), candidate_f1.get(label)),
        }
        for label in dict.fromkeys([*serving_f1, *candidate_f1])
    ]
    if ours["value"] is None or theirs["value"] is None:
        caveat = _("A version has no evaluation on a test split: nothing to compare.")
    elif same_split:
        caveat = ""
    else:
        caveat = _(
            "The versions were evaluated on different test splits (different dataset versions): "
            "the figures are indicative, not a like-for-like comparison."
        )
    return {
        "metric": metric,
        "serving": ours,
        "candidate": theirs,
        "delta": delta,
        "per_label": per_label,
        "same_split": same_split,
        "worse": delta is not None and delta < -WORSE_TOLERANCE,
        "tolerance": WORSE_TOLERANCE,
        "caveat": caveat,
    }


def serving_version(endpoint: Endpoint) -> ModelVersion | None:
    """The model version an endpoint serves: its stable revision's."""
    stable = endpoint.stable_revision
    return stable.model_version if stable is not None else None


def compare_with_serving(endpoint: Endpoint, candidate: ModelVersion) -> dict | None:
    """``candidate`` beside what ``endpoint`` serves; None when it serves nothing yet."""
    serving = serving_version(endpoint)
    if serving is None or serving.pk == candidate.pk:
        return None
    return compare_versions(serving, candidate)


def audit_data(comparison: dict | None) -> dict:
    """What the audit log keeps of a rollout to a worse version (nothing otherwise)."""
    if not comparison or not comparison["worse"]:
        return {}
    return {
        "worse_than_serving": True,
        "metric": comparison["metric"],
        "serving_value": comparison["serving"]["value"],
        "candidate_value": comparison["candidate"]["value"],
        "same_split": comparison["same_split"],
    }
