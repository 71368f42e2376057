"""Baselines every report of a classifier shows beside the model: what a majority guess and a
classical model trained in seconds score on the job's own split.

A fine-tuned model that does not beat TF-IDF with logistic regression (or a character CRF for
NER) is not worth its serving cost; the report says so. Both baselines are trained on the job's
training rows and scored on the rows the model was evaluated on, with ``runtime.metrics.evaluate``
and predictions in the shapes of ``runtime.data``, so every figure (per label too) compares.

- ``majority``: the most frequent training label (``text_classification``, ``text_pair``); the
  labels present in more than half of the training rows, else the most frequent one
  (``multi_label``); no entity (``ner``).
- ``classical``: TF-IDF character 1–3-grams (sublinear tf) with logistic regression
  (``tfidf_char_lr``): one text; a pair as ``[a, b, a ⊙ b]`` (the overlap l2-normalised) with
  one vectorizer fitted on both texts; one-vs-rest for ``multi_label``. NER: a linear-chain CRF
  over characters (``char_crf``, sklearn-crfsuite) on BIO tags.

Cost is bounded: at most ``MAX_TRAIN_ROWS`` training rows (a fixed-seed sample, so a rerun
gives the same figures), ``MAX_TFIDF_FEATURES`` n-grams, and for the CRF at most
``MAX_CRF_CHARS`` characters. A baseline that cannot be trained (one label only, no entity, an
error of the library) is ``{"error": "..."}``: the model's report never fails because of one.

numpy, scikit-learn and sklearn-crfsuite only (imported lazily); no Django.
"""

import random
import time
import unicodedata
from collections import Counter
from collections.abc import Callable

import numpy as np

from runtime.kinds import TaskKind
from runtime.metrics import _bio, evaluate

MAX_TRAIN_ROWS = 50_000
MAX_TFIDF_FEATURES = 200_000
MAX_CRF_CHARS = 1_000_000
SEED = 0
# Logistic regression on l2-normalised TF-IDF: a little less regularisation than sklearn's C=1,
# which underfits sparse n-grams on a few thousand rows.
LR_C = 10.0
# The fast model's second regression, over naive-Bayes-scaled features (NBSVM): less
# regularised (the ratios already shrink rare n-grams).
NB_LR_C = 30.0
LR_MAX_ITER = 1000
THRESHOLD = 0.5  # multi_label: a label is predicted at p ≥ 0.5, as the model's default
CRF_C1, CRF_C2, CRF_MAX_ITER = 0.1, 0.1, 100
# The fast tagger's wide CRF (the same features hashed): less regularised than the baseline's.
# 5-fold on 5,000 People's Daily sentences, hashed: entity F1 0.9047 at 0.1, 0.9068 at 0.05,
# 0.9101 at 0.02 (higher in every fold); the baseline's own features at 0.1: 0.9046.
WIDE_CRF_C1 = WIDE_CRF_C2 = 0.02

# One definition of the figure a model is judged by, per task kind (keys of ``evaluate``).
PRIMARY_METRICS: dict[str, str] = {
    TaskKind.TEXT_CLASSIFICATION: "macro_f1",
    TaskKind.TEXT_PAIR: "macro_f1",
    TaskKind.MULTI_LABEL: "micro_f1",
    TaskKind.NER: "f1",
}


def primary_metric(task_kind: str) -> str:
    try:
        return PRIMARY_METRICS[task_kind]
    except KeyError:
        raise ValueError(f"no baseline for the task kind {task_kind!r}") from None


def run_baselines(
    task_kind: str, labels: list[str], train_rows: list[dict], test_rows: list[dict]
) -> dict:
    """``{"majority": {"metrics"}, "classical": {"name", "metrics", "train_s"}, "train_rows"}``,
    each baseline ``{"error": ...}`` instead where it could not be trained or scored."""
    primary_metric(task_kind)  # a kind without baselines is the caller's error
    train = _sample(train_rows)
    labels = list(labels)
    name = "char_crf" if task_kind == TaskKind.NER else "tfidf_char_lr"

    def majority() -> dict:
        preds = _majority(task_kind, train, len(test_rows))
        return {"metrics": evaluate(task_kind, labels, test_rows, preds)}

    def classical() -> dict:
        started = time.perf_counter()
        predict = _train_classical(task_kind, labels, train)
        train_s = time.perf_counter() - started
        preds = predict(test_rows)
        return {
            "name": name,
            "metrics": evaluate(task_kind, labels, test_rows, preds),
            "train_s": round(train_s, 3),
        }

    return {
        "train_rows": len(train),
        "majority": _guarded(majority),
        "classical": {"name": name, **_guarded(classical)},
    }


def compare(task_kind: str, model_metrics: dict, baselines: dict) -> dict:
    """The model's primary metric beside the baselines'. ``beats_baseline`` is True when the
    model is at or above the classical baseline (a tie is no reason to warn: both may be
    perfect) and above the majority guess, or when nothing compares."""
    metric = primary_metric(task_kind)

    def figure(entry: dict | None) -> float | None:
        value = ((entry or {}).get("metrics") or {}).get(metric)
        return float(value) if isinstance(value, int | float) else None

    model = model_metrics.get(metric)
    model = float(model) if isinstance(model, int | float) else None
    baseline = figure(baselines.get("classical"))
    majority = figure(baselines.get("majority"))
    beats = model is None or (
        (baseline is None or model >= baseline) and (majority is None or model > majority)
    )
    return {
        "metric": metric,
        "model": model,
        "baseline": baseline,
        "majority": majority,
        "beats_baseline": bool(beats),
    }


def _guarded(fn: Callable[[], dict]) -> dict:
    try:
        return fn()
    except Exception as exc:  # a baseline never fails the report
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def _sample(rows: list[dict]) -> list[dict]:
    if len(rows) <= MAX_TRAIN_ROWS:
        return list(rows)
    # A reproducible sample, not a secret: the standard generator is right here.
    keep = sorted(random.Random(SEED).sample(range(len(rows)), MAX_TRAIN_ROWS))  # noqa: S311
    return [rows[i] for i in keep]


def _row_labels(row: dict) -> list[str]:
    return list(dict.fromkeys(row.get("labels") or []))


# --- majority -------------------------------------------------------------------------------


def _majority(task_kind: str, train: list[dict], n: int) -> list[dict]:
    if not train:
        raise ValueError("no training rows")
    if task_kind == TaskKind.NER:
        return [{"entities": []} for _ in range(n)]
    if task_kind == TaskKind.MULTI_LABEL:
        counts = Counter(label for row in train for label in _row_labels(row))
        if not counts:
            raise ValueError("no label in the training rows")
        chosen = [label for label, c in counts.items() if c > len(train) / 2]
        chosen = chosen or [counts.most_common(1)[0][0]]
        scores = {label: round(c / len(train), 6) for label, c in counts.items()}
        return [{"labels": list(chosen), "scores": dict(scores)} for _ in range(n)]
    counts = Counter(row["label"] for row in train)
    label, count = counts.most_common(1)[0]  # a tie: the label seen first
    scores = {k: round(c / len(train), 6) for k, c in counts.items()}
    return [
        {"label": label, "score": round(count / len(train), 6), "scores": dict(scores)}
        for _ in range(n)
    ]


# --- classical ------------------------------------------------------------------------------

Predict = Callable[[list[dict]], list[dict]]


def _train_classical(task_kind: str, labels: list[str], train: list[dict]) -> Predict:
    if task_kind == TaskKind.NER:
        return _train_crf(train)
    if task_kind == TaskKind.MULTI_LABEL:
        return _train_multi_label(labels, train)
    return _train_single(task_kind, train)


def _vectorizer():
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(
        analyzer="char",
        ngram_range=(1, 3),
        sublinear_tf=True,
        max_features=MAX_TFIDF_FEATURES,
        dtype=np.float32,
    )


def linear_chain_crf(c1: float, c2: float):
    """The character CRF of the baseline (and of the fast tagger's wide part), unfitted."""
    import sklearn_crfsuite

    return sklearn_crfsuite.CRF(
        algorithm="lbfgs",
        c1=c1,
        c2=c2,
        max_iterations=CRF_MAX_ITER,
        all_possible_transitions=True,
    )


def logistic(c: float = LR_C):
    """The logistic regression of the baselines (and of the fast models' wide parts)."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, max_iter=LR_MAX_ITER)


def _featurizer(task_kind: str, train: list[dict]):
    """A fitted vectorizer, as a function of rows → a sparse matrix."""
    from scipy.sparse import hstack
    from sklearn.preprocessing import normalize

    vec = _vectorizer()
    if task_kind == TaskKind.TEXT_PAIR:
        vec.fit([r["text_a"] or "" for r in train] + [r["text_b"] or "" for r in train])

        def pair(rows: list[dict]):
            a = vec.transform([r["text_a"] or "" for r in rows])
            b = vec.transform([r["text_b"] or "" for r in rows])
            # The overlap, l2-normalised: raw products of TF-IDF weights are so small that the
            # fit would rather memorise rows by their own n-grams than use what they share.
            return hstack([a, b, normalize(a.multiply(b))]).tocsr()

        return pair
    vec.fit([r["text"] or "" for r in train])
    return lambda rows: vec.transform([r["text"] or "" for r in rows])


def _train_single(task_kind: str, train: list[dict]) -> Predict:
    y = [row["label"] for row in train]
    if len(set(y)) < 2:
        raise ValueError("the training rows have one label only")
    features = _featurizer(task_kind, train)
    clf = logistic().fit(features(train), y)
    classes = [str(c) for c in clf.classes_]

    def predict(rows: list[dict]) -> list[dict]:
        if not rows:
            return []
        probs = clf.predict_proba(features(rows))
        out = []
        for p in probs:
            best = int(p.argmax())
            out.append(
                {
                    "label": classes[best],
                    "score": round(float(p[best]), 6),
                    "scores": {c: round(float(x), 6) for c, x in zip(classes, p, strict=True)},
                }
            )
        return out

    return predict


def _train_multi_label(labels: list[str], train: list[dict]) -> Predict:
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.preprocessing import MultiLabelBinarizer

    seen = [label for row in train for label in _row_labels(row)]
    if not seen:
        raise ValueError("no label in the training rows")
    classes = list(dict.fromkeys([*labels, *seen]))
    binarizer = MultiLabelBinarizer(classes=classes)
    y = binarizer.fit_transform([_row_labels(row) for row in train])
    if len(train) < 2:
        raise ValueError("one training row only")
    features = _featurizer(TaskKind.MULTI_LABEL, train)
    # A label present in every row, or in none, is learnt as a constant by OneVsRest.
    clf = OneVsRestClassifier(logistic()).fit(features(train), y)

    def predict(rows: list[dict]) -> list[dict]:
        if not rows:
            return []
        probs = clf.predict_proba(features(rows))
        return [
            {
                "labels": [c for c, x in zip(classes, p, strict=True) if x >= THRESHOLD],
                "scores": {c: round(float(x), 6) for c, x in zip(classes, p, strict=True)},
            }
            for p in probs
        ]

    return predict


def _char_kind(c: str) -> str:
    if c.isdigit():
        return "digit"
    if c.isalpha():
        return "alpha"
    if unicodedata.category(c).startswith("P"):
        return "punct"
    return "space" if c.isspace() else "other"


def _char_features(text: str) -> list[dict]:
    """Per character: itself, its neighbours ±2, the bigrams around it, its kind, BOS/EOS."""
    n = len(text)

    def at(j: int) -> str:
        return text[j] if 0 <= j < n else ("<s>" if j < 0 else "</s>")

    feats = []
    for i, c in enumerate(text):
        f: dict[str, float | str] = {
            "bias": 1.0,
            "c": c,
            "c-2": at(i - 2),
            "c-1": at(i - 1),
            "c+1": at(i + 1),
            "c+2": at(i + 2),
            "b-1": at(i - 1) + c,
            "b+1": c + at(i + 1),
            "t-1": at(i - 1) + c + at(i + 1),
            "kind": _char_kind(c),
        }
        if i == 0:
            f["BOS"] = 1.0
        if i == n - 1:
            f["EOS"] = 1.0
        feats.append(f)
    return feats


def _spans(text: str, tags: list[str], marginals: list[dict] | None) -> list[dict]:
    """BIO tags back to entities; an I- that does not continue a span of its label starts one
    (seqeval's reading of the same tags)."""
    spans: list[dict] = []
    start, label = None, None

    def close(end: int) -> None:
        if start is None:
            return
        score = 1.0
        if marginals:
            score = sum(marginals[k].get(tags[k], 0.0) for k in range(start, end)) / (end - start)
        spans.append(
            {
                "start": start,
                "end": end,
                "label": label,
                "text": text[start:end],
                "score": round(float(score), 6),
            }
        )

    for i, tag in enumerate(tags):
        prefix, _, name = tag.partition("-")
        if prefix == "B" or (prefix == "I" and name != label):
            close(i)
            start, label = i, name
        elif prefix != "I":
            close(i)
            start, label = None, None
    close(len(tags))
    return spans


def _train_crf(train: list[dict]) -> Predict:
    xs: list[list[dict]] = []
    ys: list[list[str]] = []
    chars = 0
    for row in train:
        text = row.get("text") or ""
        if not text:
            continue
        if chars + len(text) > MAX_CRF_CHARS and xs:
            break
        chars += len(text)
        xs.append(_char_features(text))
        entities = row.get("entities") or []
        # A span past the text's end (bad data) is cut at it, as the tagger's targets are.
        length = max([len(text)] + [int(e["end"]) for e in entities])
        ys.append(_bio(entities, length)[: len(text)])
    if not any(tag != "O" for tags in ys for tag in tags):
        raise ValueError("no entity in the training rows")
    crf = linear_chain_crf(CRF_C1, CRF_C2)
    crf.fit(xs, ys)

    def predict(rows: list[dict]) -> list[dict]:
        texts = [row.get("text") or "" for row in rows]
        todo = [i for i, t in enumerate(texts) if t]
        out: list[dict] = [{"entities": []} for _ in rows]
        if not todo:
            return out
        feats = [_char_features(texts[i]) for i in todo]
        tags = crf.predict(feats)
        marginals = crf.predict_marginals(feats)
        for i, t, m in zip(todo, tags, marginals, strict=True):
            out[i] = {"entities": _spans(texts[i], list(t), m)}
        return out

    return predict
