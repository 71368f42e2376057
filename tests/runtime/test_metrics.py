"""runtime.metrics against hand-computed values (no Django, no database)."""

import json

import pytest

pytest.importorskip("numpy")
pytest.importorskip("seqeval")

from runtime.metrics import evaluate

CLASSIFICATION_KEYS = {
    "accuracy",
    "macro_f1",
    "micro_f1",
    "weighted_f1",
    "per_label",
    "confusion",
    "support",
}


def rows(key: str, values: list) -> list[dict]:
    return [{key: v} for v in values]


def scores(p: float, r: float, f1: float, support: int) -> dict:
    return {"precision": p, "recall": r, "f1": f1, "support": support}


def assert_plain(result: dict) -> None:
    """JSON-serialisable Python numbers only (no numpy scalars)."""
    json.dumps(result)

    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        else:
            assert type(x) in (int, float, str), (x, type(x))

    walk(result)


def test_three_labels_known_confusion():
    # Confusion (rows = gold, columns = predicted), order A, B, C:
    #   A [3, 1, 0]  B [0, 2, 0]  C [1, 1, 1]
    # A: P 3/4, R 3/4, F1 .75 | B: P 2/4, R 2/2, F1 2/3 | C: P 1/1, R 1/3, F1 .5
    gold = rows("label", list("AAAABBCCC"))
    pred = [{"label": x, "score": 0.9, "scores": {}} for x in "AAABBBCAB"]
    result = evaluate("text_classification", ["A", "B", "C"], gold, pred)

    assert set(result) == CLASSIFICATION_KEYS
    assert result["confusion"] == {
        "labels": ["A", "B", "C"],
        "matrix": [[3, 1, 0], [0, 2, 0], [1, 1, 1]],
    }
    assert result["per_label"] == {
        "A": scores(0.75, 0.75, 0.75, 4),
        "B": scores(0.5, 1.0, 0.666667, 2),
        "C": scores(1.0, 0.333333, 0.5, 3),
    }
    assert result["accuracy"] == 0.666667  # 6/9
    assert result["micro_f1"] == 0.666667  # = accuracy for single-label
    assert result["macro_f1"] == 0.638889  # (.75 + 2/3 + .5) / 3
    assert result["weighted_f1"] == 0.648148  # (.75*4 + 2/3*2 + .5*3) / 9
    assert result["support"] == 9
    assert_plain(result)


def test_text_pair_same_as_classification():
    gold = rows("label", ["yes", "no", "yes"])
    pred = rows("label", ["yes", "yes", "yes"])
    a = evaluate("text_pair", ["yes", "no"], gold, pred)
    b = evaluate("text_classification", ["yes", "no"], gold, pred)
    assert a == b
    assert a["accuracy"] == 0.666667


def test_unknown_predicted_label_is_appended_and_counts_in_macro():
    gold = rows("label", ["A", "B", "A"])
    pred = rows("label", ["A", "X", "X"])
    result = evaluate("text_classification", ["A", "B", "Unused"], gold, pred)

    assert result["confusion"]["labels"] == ["A", "B", "Unused", "X"]
    assert result["confusion"]["matrix"] == [
        [1, 0, 0, 1],
        [0, 0, 0, 1],
        [0, 0, 0, 0],
        [0, 0, 0, 0],
    ]
    assert result["per_label"]["A"] == scores(1.0, 0.5, 0.666667, 2)
    assert result["per_label"]["B"] == scores(0.0, 0.0, 0.0, 1)
    assert result["per_label"]["X"] == scores(0.0, 0.0, 0.0, 0)
    assert result["per_label"]["Unused"] == scores(0.0, 0.0, 0.0, 0)
    # Macro over A, B, X (gold or predicted); "Unused" is neither.
    assert result["macro_f1"] == 0.222222
    assert result["micro_f1"] == 0.333333
    assert result["weighted_f1"] == 0.444444  # (2/3*2 + 0*1) / 3
    assert result["accuracy"] == 0.333333


def test_extra_labels_in_order_of_first_appearance():
    gold = rows("label", ["A", "Z", "Y"])
    pred = rows("label", ["X", "A", "Z"])
    result = evaluate("text_classification", ["A"], gold, pred)
    assert result["confusion"]["labels"] == ["A", "X", "Z", "Y"]


def test_sklearn_agrees_on_classification():
    metrics = pytest.importorskip("sklearn.metrics")
    gold_l = list("AAAABBCCCBA")
    pred_l = list("AAABBBCABQA")
    result = evaluate(
        "text_classification", ["A", "B", "C"], rows("label", gold_l), rows("label", pred_l)
    )
    union = ["A", "B", "C", "Q"]
    for avg in ("macro", "micro", "weighted"):
        expected = metrics.f1_score(gold_l, pred_l, labels=union, average=avg, zero_division=0)
        assert result[f"{avg}_f1"] == round(expected, 6)
    assert (
        result["confusion"]["matrix"]
        == metrics.confusion_matrix(gold_l, pred_l, labels=union).tolist()
    )


@pytest.mark.parametrize("kind", ["text_classification", "text_pair", "multi_label", "ner"])
def test_empty_input_returns_zeros(kind):
    result = evaluate(kind, ["A", "B"], [], [])
    assert result["support"] == 0
    for key in ("accuracy", "macro_f1", "micro_f1", "weighted_f1"):
        assert result[key] == 0.0
    assert result["per_label"] == {"A": scores(0.0, 0.0, 0.0, 0), "B": scores(0.0, 0.0, 0.0, 0)}
    if kind in ("text_classification", "text_pair"):
        assert result["confusion"] == {"labels": ["A", "B"], "matrix": [[0, 0], [0, 0]]}
    assert_plain(result)


def test_misaligned_inputs_and_unknown_kind_raise():
    with pytest.raises(ValueError):
        evaluate("text_classification", [], rows("label", ["A"]), [])
    with pytest.raises(ValueError):
        evaluate("summarization", [], [], [])


def test_multi_label_hand_values():
    gold = rows("labels", [["x", "y"], ["y"], ["x", "z"], [], ["z"]])
    pred = rows("labels", [["x"], ["y", "z"], ["z", "x"], [], ["w"]])
    result = evaluate("multi_label", ["x", "y", "z", "v"], gold, pred)

    assert "confusion" not in result
    assert result["label_confusion"] == {
        "x": {"tp": 2, "fp": 0, "fn": 0, "tn": 3},
        "y": {"tp": 1, "fp": 0, "fn": 1, "tn": 3},
        "z": {"tp": 1, "fp": 1, "fn": 1, "tn": 2},
        "v": {"tp": 0, "fp": 0, "fn": 0, "tn": 5},
        "w": {"tp": 0, "fp": 1, "fn": 0, "tn": 4},
    }
    assert result["per_label"] == {
        "x": scores(1.0, 1.0, 1.0, 2),
        "y": scores(1.0, 0.5, 0.666667, 2),
        "z": scores(0.5, 0.5, 0.5, 2),
        "v": scores(0.0, 0.0, 0.0, 0),
        "w": scores(0.0, 0.0, 0.0, 0),
    }
    assert result["accuracy"] == 0.4  # rows 3 and 4 match exactly
    assert result["micro_f1"] == 0.666667  # TP 4, FP 2, FN 2: 8/12
    assert result["macro_f1"] == 0.541667  # (1 + 2/3 + .5 + 0) / 4, v left out
    assert result["weighted_f1"] == 0.722222  # (1*2 + 2/3*2 + .5*2) / 6
    assert result["support"] == 5
    assert_plain(result)


def entity(start: int, end: int, label: str) -> dict:
    return {"start": start, "end": end, "label": label}


def test_ner_hand_values():
    gold = [
        {"text": "张三在北京工作", "entities": [entity(0, 2, "PER"), entity(3, 5, "LOC")]},
        {"text": "李四去上海", "entities": [entity(0, 2, "PER"), entity(3, 5, "LOC")]},
    ]
    pred = [
        # PER exact (right), LOC [3, 4) overlaps [3, 5) only partly (wrong).
        {"entities": [{**entity(0, 2, "PER"), "text": "张三", "score": 0.9}, entity(3, 4, "LOC")]},
        # Right span, wrong type (wrong); PER missed.
        {"entities": [entity(3, 5, "ORG")]},
    ]
    result = evaluate("ner", ["PER", "LOC"], gold, pred)

    assert result["per_label"] == {
        "PER": scores(1.0, 0.5, 0.666667, 2),
        "LOC": scores(0.0, 0.0, 0.0, 2),
        "ORG": scores(0.0, 0.0, 0.0, 0),
    }
    # 1 right of 3 predicted, of 4 gold.
    assert result["precision"] == 0.333333
    assert result["recall"] == 0.25
    assert result["f1"] == result["micro_f1"] == 0.285714  # 2/7
    assert result["macro_f1"] == 0.222222  # (2/3 + 0 + 0) / 3 (ORG was predicted)
    assert result["weighted_f1"] == 0.333333  # (2/3*2 + 0*2) / 4
    assert result["support"] == 4
    # Character tags: 6 of 7, then 1 of 5 (only the O of 去).
    assert result["accuracy"] == 0.583333
    assert_plain(result)


def test_ner_perfect_prediction():
    gold = [{"text": "王五在杭州", "entities": [entity(0, 2, "PER"), entity(3, 5, "LOC")]}]
    pred = [{"entities": [entity(3, 5, "LOC"), entity(0, 2, "PER")]}]
    result = evaluate("ner", ["PER", "LOC"], gold, pred)
    for key in ("precision", "recall", "f1", "micro_f1", "macro_f1", "weighted_f1", "accuracy"):
        assert result[key] == 1.0
    assert result["per_label"]["PER"] == scores(1.0, 1.0, 1.0, 1)


def test_ner_without_text_and_without_entities():
    # No "text": the length is the furthest span end; a span past it does not crash.
    gold = [{"entities": [entity(1, 3, "PER")]}, {"entities": []}]
    pred = [{"entities": [entity(1, 3, "PER"), entity(4, 6, "LOC")]}, {"entities": []}]
    result = evaluate("ner", ["PER"], gold, pred)
    assert result["per_label"]["PER"] == scores(1.0, 1.0, 1.0, 1)
    assert result["per_label"]["LOC"] == scores(0.0, 0.0, 0.0, 0)
    assert result["precision"] == 0.5
    assert result["support"] == 1
    assert result["accuracy"] == 0.666667  # 4 of 6 tags

    # Texts but no entity on either side: zeros, all-O tags agree.
    none = evaluate("ner", ["PER"], [{"text": "abc", "entities": []}], [{"entities": []}])
    assert none["f1"] == 0.0 and none["support"] == 0 and none["accuracy"] == 1.0


def test_ner_overlapping_gold_span_is_left_out():
    # The nested [1, 2) starts inside [0, 3): BIO cannot hold it.
    gold = [{"text": "abcd", "entities": [entity(0, 3, "ORG"), entity(1, 2, "PER")]}]
    pred = [{"entities": [entity(0, 3, "ORG")]}]
    result = evaluate("ner", ["ORG", "PER"], gold, pred)
    assert result["f1"] == 1.0
    assert result["support"] == 1
