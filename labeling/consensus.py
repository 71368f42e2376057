"""From several annotators' answers to one: conflict rules for export, and agreement.

An answer is the dataset's value of an annotation: ``{"label": x}``, ``{"labels": [...]}``,
``{"entities": [{"start", "end", "label"}]}``, or a generative kind's ``{"messages": [...]}``
(a written response) and ``{"chosen", "rejected"}`` (a judged pair).
"""

from collections import Counter
from collections.abc import Sequence

from runtime.kinds import TaskKind

RULES = ("majority", "reviewer", "drop")


def _key(value: dict):
    if "entities" in value:
        return tuple(sorted((e["start"], e["end"], e["label"]) for e in value["entities"]))
    if "labels" in value:
        return tuple(sorted(value["labels"]))
    if "messages" in value:
        return value["messages"][-1]["content"]
    if "chosen" in value:
        return value["chosen"]
    return value.get("label")


def _majority(values: Sequence[dict]) -> dict | None:
    """Single label: the label more than half chose. Several labels or spans: each label or
    span that more than half of the annotators chose. None when no majority exists."""
    n = len(values)
    first = values[0]
    if "entities" in first or "labels" in first:
        votes = Counter(item for v in values for item in set(_key(v)))
        kept = sorted(item for item, c in votes.items() if c * 2 > n)
        if "entities" in first:
            return {"entities": [{"start": s, "end": e, "label": lab} for s, e, lab in kept]}
        return {"labels": kept}
    key, count = Counter(_key(v) for v in values).most_common(1)[0]
    if count * 2 > n:
        return next(v for v in values if _key(v) == key)
    if "messages" in first:
        # Written responses rarely agree to the letter: the latest one stands.
        return values[-1]
    return None


def resolve(answers: Sequence[tuple[str, dict]], rule: str, reviewer: str = "") -> dict | None:
    """One answer from ``(annotator, value)`` pairs; None drops the row."""
    if not answers:
        return None
    values = [v for _who, v in answers]
    if rule == "drop":
        return values[0] if len({_key(v) for v in values}) == 1 else None
    if rule == "reviewer":
        chosen = [v for who, v in answers if who == reviewer]
        if chosen:
            return chosen[-1]
    return _majority(values)


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Cohen's kappa of two annotators' labels on the same items; None without items."""
    n = len(a)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    pa, pb = Counter(a), Counter(b)
    expected = sum(pa[k] * pb[k] for k in pa) / (n * n)
    if expected == 1:
        return 1.0
    return (observed - expected) / (1 - expected)


def f1(a: set, b: set) -> float | None:
    """F1 of one annotator's items against another's (symmetric); None when both are empty."""
    if not a and not b:
        return None
    return 2 * len(a & b) / (len(a) + len(b))


def items_of(value: dict) -> set:
    """What F1 compares: labels (multi-label) or (start, end, label) spans (NER)."""
    key = _key(value)
    return set(key) if isinstance(key, tuple) else {key}


def agreement(answers: dict[int, list[tuple[str, dict]]], kind: str) -> dict:
    """Agreement of a project's annotators: per annotator pair (Cohen's kappa for single-label
    kinds, F1 over labels or spans otherwise), per label, and the rows most disputed."""
    from itertools import combinations

    if kind == TaskKind.INSTRUCTION:  # free text: no agreement figure
        return {"pairs": [], "labels": {}, "disputed": []}
    single = kind in (TaskKind.TEXT_CLASSIFICATION, TaskKind.TEXT_PAIR, TaskKind.PREFERENCE)
    annotators = sorted({who for rows in answers.values() for who, _v in rows})
    pairs = []
    for a, b in combinations(annotators, 2):
        shared = []
        for rows in answers.values():
            by = dict(rows)
            if a in by and b in by:
                shared.append((by[a], by[b]))
        if not shared:
            continue
        if single:
            score = cohen_kappa([_key(x) for x, _ in shared], [_key(y) for _, y in shared])
        else:
            scores = [f1(items_of(x), items_of(y)) for x, y in shared]
            scores = [s for s in scores if s is not None]
            score = sum(scores) / len(scores) if scores else None
        pairs.append({"a": a, "b": b, "items": len(shared), "score": score})
    labels = sorted(
        set()
        if kind == TaskKind.PREFERENCE  # the "labels" would be the responses themselves
        else {
            lab
            for rows in answers.values()
            for _w, v in rows
            for lab in (
                {_key(v)} if single else {i[-1] if isinstance(i, tuple) else i for i in items_of(v)}
            )
        }
    )
    per_label = {}
    for label in labels:
        # One label against the rest: how often the annotators of a row agree on it.
        agree = total = 0
        for rows in answers.values():
            if len(rows) < 2:
                continue
            marks = [
                label
                in (
                    {_key(v)}
                    if single
                    else {i[-1] if isinstance(i, tuple) else i for i in items_of(v)}
                )
                for _w, v in rows
            ]
            if any(marks):
                total += 1
                agree += all(marks)
        per_label[label] = {"rows": total, "agreement": agree / total if total else None}
    disputed = sorted(
        ((row, len({_key(v) for _w, v in rows})) for row, rows in answers.items() if len(rows) > 1),
        key=lambda x: (-x[1], x[0]),
    )
    return {
        "pairs": pairs,
        "labels": per_label,
        "disputed": [{"row": r, "answers": n} for r, n in disputed if n > 1][:50],
    }
