"""Distillation (a job of objective "distill"): a student preset learns what a teacher model
version decides. The teacher's export is in ``parent/`` of the work directory; before the
student trains, the teacher labels the job's training rows and every unlabeled row of the
dataset, and those labels become the training split (the gold one is kept aside as
``train.gold.jsonl``, so that a resumed job labels from it again). The student then trains,
exports and is evaluated on the gold test split like any model, and its report's
``compression`` holds the method, the student, the rows it learned from, and the figures
beside the teacher (runtime.compress's: deltas, sizes, latency).

Each row carries the teacher's decision (its label, labels or entity spans) and, for the
classification kinds, its scores (``runtime.data.SOFT``): the student learns the teacher's
distribution over the labels (cross-entropy against it), which says more than the decision
alone (how sure the teacher was, which label came second). A tagger learns the decisions: a
CRF has no soft tags to learn. The baselines of the student's report train on the decisions.
"""

import json
import os
from pathlib import Path

from runtime.compress import PARENT_DIR, compared
from runtime.data import SOFT, is_labeled, model_input, read_rows
from runtime.inference import Predictor

OBJECTIVE = "distill"
GOLD = "train.gold.jsonl"


def _labeled_by(kind: str, row: dict, pred: dict) -> dict:
    """``row`` with the teacher's decision as its annotation."""
    row = {k: v for k, v in row.items() if k not in ("label", "labels", "entities", SOFT)}
    if kind == "ner":
        row["entities"] = [
            {"start": e["start"], "end": e["end"], "label": e["label"]} for e in pred["entities"]
        ]
    elif kind == "multi_label":
        row["labels"] = list(pred["labels"])
        row[SOFT] = dict(pred["scores"])
    else:
        row["label"] = pred["label"]
        row[SOFT] = dict(pred["scores"])
    return row


def teacher_labels(spec, workdir: Path, emit) -> dict:
    """Write the training split the student learns from: the teacher's decisions on the
    training rows and on the unlabeled rows of every split. Returns what it did."""
    data = workdir / "data"
    gold = data / GOLD
    if not gold.exists():
        os.replace(data / "train.jsonl", gold)
    kind = spec.task_kind
    train = read_rows(gold)
    unlabeled = [
        row
        for split in ("dev", "test")
        if (data / f"{split}.jsonl").exists()
        for row in read_rows(data / f"{split}.jsonl")
        if not is_labeled(kind, row)
    ]
    rows = train + unlabeled
    emit("state", phase="teacher")
    teacher = Predictor.load(workdir / PARENT_DIR / "export")
    preds = teacher.predict([model_input(kind, row) for row in rows])
    labeled = [_labeled_by(kind, row, pred) for row, pred in zip(rows, preds, strict=True)]
    tmp = data / "train.jsonl.new"
    tmp.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in labeled), encoding="utf-8"
    )
    os.replace(tmp, data / "train.jsonl")
    gold_rows = [(r, p) for r, p in zip(rows, labeled, strict=True) if is_labeled(kind, r)]
    agree = sum(_annotation(kind, r) == _annotation(kind, p) for r, p in gold_rows)
    done = {
        "rows": len(rows),
        "unlabeled_rows": len(rows) - len(gold_rows),
        "teacher_train_agreement": round(agree / len(gold_rows), 6) if gold_rows else None,
    }
    emit(
        "log",
        message=f"the teacher labelled {len(rows)} rows ({done['unlabeled_rows']} unlabeled);"
        f" it agrees with the gold labels of {done['teacher_train_agreement']} of the others",
    )
    return done


def _annotation(kind: str, row: dict):
    if kind == "ner":
        return sorted((e["start"], e["end"], e["label"]) for e in row.get("entities") or [])
    if kind == "multi_label":
        return sorted(row.get("labels") or [])
    return row.get("label")


def distillation_report(spec, workdir: Path, scored: tuple, done: dict) -> dict:
    """The student beside its teacher (the ``compression`` of its version); ``scored`` is the
    student's (rows, predictions, metrics) on the test split."""
    figures = compared(spec, workdir, scored, workdir / "export", None)
    return {
        "method": OBJECTIVE,
        "params": {"student": spec.preset, **done},
        **figures,
    }
