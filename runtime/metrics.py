"""Evaluation metrics of a model's predictions against a dataset's rows (framework-free), and
the character-level ROUGE-L of a generation against its reference.

Runs inside the training runner: numpy and seqeval only, no Django. Rows and predictions have
the shapes of ``runtime.data``; every number ``evaluate`` returns is a Python float rounded to
6 decimals or a Python int, so the result is JSON-serialisable as it is.
"""

from collections.abc import Iterable

import numpy as np

from runtime.kinds import TaskKind

DIGITS = 6
CLASSIFICATION_KINDS = (TaskKind.TEXT_CLASSIFICATION, TaskKind.TEXT_PAIR)


def evaluate(task_kind: str, labels: list[str], gold: list[dict], predicted: list[dict]) -> dict:
    """Scores ``predicted`` against ``gold`` (index-aligned) for a task kind.

    - ``text_classification``, ``text_pair``: rows and predictions carry ``"label"``. Returns
      accuracy, macro/micro/weighted F1, ``per_label`` precision/recall/f1/support, ``confusion``
      (rows = gold, columns = predicted) and ``support`` (number of rows).
    - ``multi_label``: rows and predictions carry ``"labels"`` (a list, taken as a set). Returns
      accuracy (exact subset match ratio), the F1s, one-vs-rest ``per_label``,
      ``label_confusion`` ({label: {tp, fp, fn, tn}}) and ``support`` (number of rows).
    - ``ner``: rows and predictions carry ``"entities"`` ({start, end, label}, character
      offsets, end exclusive). Entity-level exact match by seqeval (default, conlleval mode) on
      character BIO tags. Returns precision, recall, f1 (micro, also as ``micro_f1``), macro and
      weighted F1, ``per_label`` by entity type, ``support`` (gold entities) and ``accuracy``
      (character tag accuracy, O included).

    Label order: ``labels`` first, then any other gold or predicted label in order of first
    appearance (row by row, the gold one before the predicted one). ``per_label`` lists every
    label of that order, but the macro average (sklearn semantics, labels = union of gold and
    predicted) only counts labels that have support or were predicted at least once: a label of
    ``labels`` absent from both does not drag the average down. Weighted averages weigh by gold
    support. Any division by zero gives 0.0; no rows gives zeros.
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold rows but {len(predicted)} predictions")
    if task_kind in CLASSIFICATION_KINDS:
        return _single_label(labels, gold, predicted)
    if task_kind == "multi_label":
        return _multi_label(labels, gold, predicted)
    if task_kind == "ner":
        return _ner(labels, gold, predicted)
    raise ValueError(f"no metrics for the task kind {task_kind!r}")


def _r(x: float) -> float:
    return round(float(x), DIGITS)


def _div(num: float, den: float) -> float:
    return float(num) / float(den) if den else 0.0


def _order(labels: list[str], seen: Iterable[str]) -> list[str]:
    """``labels``, then the labels of ``seen`` not among them, in order of first appearance."""
    order = list(dict.fromkeys(labels))
    known = set(order)
    for label in seen:
        if label not in known:
            known.add(label)
            order.append(label)
    return order


def _scores(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray, order: list[str]) -> dict:
    """Per-label and averaged scores from per-label counts (arrays aligned with ``order``)."""
    support = tp + fn
    per_label = {}
    f1s = []
    for i, label in enumerate(order):
        f1 = _div(2 * tp[i], 2 * tp[i] + fp[i] + fn[i])
        f1s.append(f1)
        per_label[label] = {
            "precision": _r(_div(tp[i], tp[i] + fp[i])),
            "recall": _r(_div(tp[i], support[i])),
            "f1": _r(f1),
            "support": int(support[i]),
        }
    f1s_arr = np.asarray(f1s, dtype="float64")
    active = (support + fp) > 0  # gold or predicted at least once
    TP, FP, FN = int(tp.sum()), int(fp.sum()), int(fn.sum())
    return {
        "macro_f1": _r(f1s_arr[active].mean()) if active.any() else 0.0,
        "micro_f1": _r(_div(2 * TP, 2 * TP + FP + FN)),
        "weighted_f1": _r(_div((f1s_arr * support).sum(), support.sum())),
        "per_label": per_label,
    }


def _single_label(labels: list[str], gold: list[dict], predicted: list[dict]) -> dict:
    pairs = [(g["label"], p["label"]) for g, p in zip(gold, predicted, strict=True)]
    order = _order(labels, (label for pair in pairs for label in pair))
    index = {label: i for i, label in enumerate(order)}
    matrix = np.zeros((len(order), len(order)), dtype="int64")
    for g, p in pairs:
        matrix[index[g], index[p]] += 1
    tp = np.diag(matrix)
    fp = matrix.sum(axis=0) - tp
    fn = matrix.sum(axis=1) - tp
    n = len(pairs)
    return {
        "accuracy": _r(_div(tp.sum(), n)),
        **_scores(tp, fp, fn, order),
        "confusion": {"labels": order, "matrix": matrix.tolist()},
        "support": n,
    }


def _multi_label(labels: list[str], gold: list[dict], predicted: list[dict]) -> dict:
    pairs = [
        (list(dict.fromkeys(g["labels"] or [])), list(dict.fromkeys(p["labels"] or [])))
        for g, p in zip(gold, predicted, strict=True)
    ]
    order = _order(labels, (label for g, p in pairs for label in (*g, *p)))
    index = {label: i for i, label in enumerate(order)}
    k, n = len(order), len(pairs)
    tp, fp, fn = (np.zeros(k, dtype="int64") for _ in range(3))
    exact = 0
    for g, p in pairs:
        gs, ps = set(g), set(p)
        exact += gs == ps
        for label in gs & ps:
            tp[index[label]] += 1
        for label in ps - gs:
            fp[index[label]] += 1
        for label in gs - ps:
            fn[index[label]] += 1
    tn = n - tp - fp - fn
    return {
        "accuracy": _r(_div(exact, n)),
        **_scores(tp, fp, fn, order),
        "label_confusion": {
            label: {"tp": int(tp[i]), "fp": int(fp[i]), "fn": int(fn[i]), "tn": int(tn[i])}
            for i, label in enumerate(order)
        },
        "support": n,
    }


def _bio(entities: list[dict], length: int) -> list[str]:
    """Character BIO tags of spans. Spans are written by start (longest first at a tie); one that
    starts inside an earlier span (nested, overlapping) cannot be written and is left out, as is
    an empty or negative span."""
    tags = ["O"] * length
    spans = sorted(
        ((int(e["start"]), int(e["end"]), str(e["label"])) for e in entities),
        key=lambda s: (s[0], -s[1]),
    )
    for start, end, label in spans:
        if start < 0 or end <= start or tags[start] != "O":
            continue
        tags[start] = f"B-{label}"
        for pos in range(start + 1, end):
            tags[pos] = f"I-{label}"
    return tags


def _ner(labels: list[str], gold: list[dict], predicted: list[dict]) -> dict:
    from seqeval.metrics import accuracy_score, classification_report

    y_true, y_pred = [], []
    for g, p in zip(gold, predicted, strict=True):
        g_ents, p_ents = g.get("entities") or [], p.get("entities") or []
        # Long enough for the text and for every span, even one past the text's end.
        length = max([len(g.get("text") or "")] + [int(e["end"]) for e in (*g_ents, *p_ents)])
        y_true.append(_bio(g_ents, length))
        y_pred.append(_bio(p_ents, length))

    tokens = sum(len(tags) for tags in y_true)
    accuracy = _r(accuracy_score(y_true, y_pred)) if tokens else 0.0
    seen = (tag[2:] for tags in (*y_true, *y_pred) for tag in tags if tag.startswith("B-"))
    order = _order(labels, seen)
    zero = {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    if not any(tag != "O" for tags in (*y_true, *y_pred) for tag in tags):
        # No entity on either side: seqeval has no type to report on.
        return {
            "precision": 0.0,
            "recall": 0.0,
            "f1": 0.0,
            "micro_f1": 0.0,
            "macro_f1": 0.0,
            "weighted_f1": 0.0,
            "per_label": {label: dict(zero) for label in order},
            "support": 0,
            "accuracy": accuracy,
        }

    report = classification_report(y_true, y_pred, output_dict=True, zero_division=0)

    def entry(scores: dict) -> dict:
        return {
            "precision": _r(scores["precision"]),
            "recall": _r(scores["recall"]),
            "f1": _r(scores["f1-score"]),
            "support": int(scores["support"]),
        }

    micro = entry(report["micro avg"])
    return {
        "precision": micro["precision"],
        "recall": micro["recall"],
        "f1": micro["f1"],
        "micro_f1": micro["f1"],
        "macro_f1": _r(report["macro avg"]["f1-score"]),
        "weighted_f1": _r(report["weighted avg"]["f1-score"]),
        "per_label": {
            label: entry(report[label]) if label in report else dict(zero) for label in order
        },
        "support": micro["support"],
        "accuracy": accuracy,
    }


def rouge_l(candidate: str, reference: str) -> float:
    """Character-level ROUGE-L F1: Chinese has no spaces to split words on."""
    a = [c for c in candidate if not c.isspace()]
    b = [c for c in reference if not c.isspace()]
    if not a or not b:
        return 0.0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)
