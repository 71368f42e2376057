"""The baselines every classifier's report shows: trained on a generated Chinese corpus with a
known signal, scored with the model's own metrics."""

import json
import random

import pytest

from runtime import run
from runtime.baselines import compare, primary_metric, run_baselines

# Common CJK characters as noise around the signal words.
FILLER = [chr(c) for c in range(0x4E00, 0x4E00 + 400)]


def _noise(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(FILLER) for _ in range(n))


def _classification(n: int, seed: int) -> list[dict]:
    """Three labels, 60/25/15: each row holds one of its label's words among random characters."""
    rng = random.Random(seed)
    words = {
        "正面": ["满意", "喜欢", "推荐"],
        "负面": ["失望", "糟糕", "退货"],
        "中性": ["一般", "凑合"],
    }
    rows = []
    for _ in range(n):
        label = rng.choices(["正面", "负面", "中性"], weights=[60, 25, 15])[0]
        text = _noise(rng, rng.randint(3, 8)) + rng.choice(words[label]) + _noise(rng, 4)
        rows.append({"text": text, "label": label})
    return rows


def test_the_classical_baseline_beats_the_majority_guess():
    train, test = _classification(600, 1), _classification(200, 2)
    labels = ["正面", "负面", "中性"]
    out = run_baselines("text_classification", labels, train, test)
    majority, classical = out["majority"]["metrics"], out["classical"]["metrics"]
    assert out["classical"]["name"] == "tfidf_char_lr" and out["classical"]["train_s"] >= 0
    assert out["train_rows"] == 600
    # The majority guess is the frequent label only: its accuracy is its share, macro-F1 low.
    assert majority["per_label"]["负面"]["f1"] == 0.0 and majority["per_label"]["正面"]["f1"] > 0.6
    assert majority["macro_f1"] < 0.35
    assert classical["macro_f1"] > 0.9 and classical["accuracy"] > majority["accuracy"]
    assert set(classical["per_label"]) == set(labels)
    json.dumps(out)  # goes into evaluation.json as it is

    worse = compare("text_classification", {"macro_f1": 0.5, "accuracy": 0.9}, out)
    assert worse["metric"] == "macro_f1" and worse["beats_baseline"] is False
    assert worse["baseline"] == classical["macro_f1"] and worse["majority"] == majority["macro_f1"]
    better = compare("text_classification", {"macro_f1": 0.999}, out)
    assert better["beats_baseline"] is (0.999 > classical["macro_f1"])


def test_compare_falls_back_to_the_majority_and_never_flags_without_figures():
    failed = {"classical": {"error": "x"}, "majority": {"metrics": {"micro_f1": 0.6}}}
    assert compare("multi_label", {"micro_f1": 0.55}, failed)["beats_baseline"] is False
    assert compare("multi_label", {"micro_f1": 0.7}, failed)["beats_baseline"] is True
    assert compare("ner", {"f1": 0.1}, {})["beats_baseline"] is True
    # A tie with the classical baseline is no reason to warn; a tie with the majority is.
    both = {"classical": {"metrics": {"f1": 1.0}}, "majority": {"metrics": {"f1": 0.0}}}
    assert compare("ner", {"f1": 1.0}, both)["beats_baseline"] is True
    assert compare("multi_label", {"micro_f1": 0.6}, failed)["beats_baseline"] is False
    kinds = ("text_classification", "text_pair", "multi_label", "ner")
    assert [primary_metric(k) for k in kinds] == ["macro_f1", "macro_f1", "micro_f1", "f1"]
    with pytest.raises(ValueError):
        primary_metric("instruction")


def test_one_label_in_training_gives_an_error_entry_not_an_exception():
    train = [{"text": f"很好{i}", "label": "正面"} for i in range(20)]
    test = [{"text": "很差", "label": "负面"}, {"text": "很好", "label": "正面"}]
    out = run_baselines("text_classification", ["正面", "负面"], train, test)
    assert "one label" in out["classical"]["error"] and out["classical"]["name"] == "tfidf_char_lr"
    assert out["majority"]["metrics"]["accuracy"] == 0.5
    empty = run_baselines("text_pair", ["相似", "不相似"], [], test)
    assert "error" in empty["majority"] and "error" in empty["classical"]


def _pairs(n: int, seed: int) -> list[dict]:
    """Same topic word in both texts: 相似; different topics: 不相似."""
    rng = random.Random(seed)
    topics = ["天气", "股票", "足球", "音乐", "电影", "手机", "高铁", "咖啡"]
    rows = []
    for _ in range(n):
        a = rng.choice(topics)
        same = rng.random() < 0.5
        b = a if same else rng.choice([t for t in topics if t != a])
        rows.append(
            {
                "text_a": _noise(rng, 3) + a + _noise(rng, 3),
                "text_b": _noise(rng, 2) + b + _noise(rng, 4),
                "label": "相似" if same else "不相似",
            }
        )
    return rows


def test_text_pairs_learn_from_both_texts():
    out = run_baselines("text_pair", ["相似", "不相似"], _pairs(800, 3), _pairs(200, 4))
    classical = out["classical"]["metrics"]
    assert classical["macro_f1"] > 0.8 > out["majority"]["metrics"]["macro_f1"]


def test_multi_label_majority_and_one_vs_rest():
    rng = random.Random(5)
    cues = {"物流": "快递", "质量": "做工", "价格": "便宜"}

    def rows(n):
        out = []
        for _ in range(n):
            labels = [k for k in cues if rng.random() < (0.7 if k == "物流" else 0.3)] or ["物流"]
            text = "".join(_noise(rng, 2) + cues[k] for k in labels) + _noise(rng, 3)
            out.append({"text": text, "labels": labels})
        return out

    out = run_baselines("multi_label", list(cues), rows(500), rows(150))
    majority = out["majority"]["metrics"]
    assert majority["per_label"]["物流"]["recall"] == 1.0  # in more than half the rows
    assert majority["per_label"]["价格"]["f1"] == 0.0
    assert out["classical"]["metrics"]["micro_f1"] > 0.9 > majority["micro_f1"]


def _ner(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    people, cities = ["张伟", "李娜", "王芳", "刘洋", "陈静"], ["北京", "上海", "杭州", "成都"]
    rows = []
    for _ in range(n):
        person, city = rng.choice(people), rng.choice(cities)
        template = rng.choice(["{p}昨天去了{c}。", "在{c}见到{p}了", "{p}说{c}的天气很好"])
        text = template.format(p=person, c=city)
        p, c = text.index(person), text.index(city)
        rows.append(
            {
                "text": text,
                "entities": [
                    {"start": p, "end": p + len(person), "label": "人名"},
                    {"start": c, "end": c + len(city), "label": "地名"},
                ],
            }
        )
    return rows


def test_the_character_crf_finds_entities():
    test = [*_ner(60, 7), {"text": "", "entities": []}]
    out = run_baselines("ner", ["人名", "地名"], _ner(200, 6), test)
    assert out["majority"]["metrics"]["f1"] == 0.0
    classical = out["classical"]
    assert classical["name"] == "char_crf" and classical["metrics"]["f1"] > 0.9
    assert classical["metrics"]["per_label"]["地名"]["f1"] > 0.9
    assert compare("ner", {"f1": 0.5}, out)["beats_baseline"] is False
    none = run_baselines("ner", ["人名"], [{"text": "没有实体", "entities": []}], test)
    assert "no entity" in none["classical"]["error"]


def test_the_runner_adds_baselines_to_the_report(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    train = _classification(300, 8)
    (tmp_path / "data" / "train.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in train), encoding="utf-8"
    )
    rows = _classification(50, 9)
    report = {"macro_f1": 0.2, "accuracy": 0.6}
    added = run._baselines("text_classification", ["正面", "负面", "中性"], tmp_path, rows, report)
    assert added["comparison"]["beats_baseline"] is False
    assert added["baselines"]["classical"]["metrics"]["support"] == 50
    events = [
        json.loads(line[len(run.EVENT_PREFIX) :])
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(run.EVENT_PREFIX)
    ]
    logs = [e["message"] for e in events if e["kind"] == "log"]
    assert logs and "does NOT beat" in logs[0] and "tfidf_char_lr" in logs[0]


def test_training_rows_are_capped_by_a_reproducible_sample(monkeypatch):
    import runtime.baselines as baselines

    monkeypatch.setattr(baselines, "MAX_TRAIN_ROWS", 100)
    train, test = _classification(400, 10), _classification(50, 11)
    first = run_baselines("text_classification", ["正面", "负面", "中性"], train, test)
    again = run_baselines("text_classification", ["正面", "负面", "中性"], train, test)
    assert first["train_rows"] == 100
    assert first["classical"]["metrics"] == again["classical"]["metrics"]
