"""Long texts (#20): a text longer than the model's maximum length is read in overlapping
windows in training, evaluation and serving, and the windows' outputs are pooled."""

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from runtime import data
from runtime.tokenizer import CharTokenizer
from tests.helpers.workdir import TOPIC_FILLER, _filler, make_workdir

NER = data.LabelSpace("ner", ("PER", "LOC"))


@pytest.mark.parametrize("max_length", [8, 32, 33, 128])
def test_windows_cover_the_text_with_overlap(max_length):
    size = max_length - 2
    for length in [0, 1, size, size + 1, 2 * size + 3, 5 * size + 7, 1000]:
        wins, truncated = data.text_windows(length, max_length)
        assert not truncated or len(wins) == data.MAX_WINDOWS
        if length <= size:
            assert wins == [(0, length)] and not truncated
            continue
        assert wins[0][0] == 0 and all(e - s == size for s, e in wins)
        covered = np.zeros(length, dtype=bool)
        for (s1, e1), (s2, _e2) in itertools.pairwise(wins):
            assert s1 < s2 and e1 - s2 >= size // 2  # half a window of overlap at least
        for s, e in wins:
            covered[s:e] = True
        if not truncated:
            assert wins[-1][1] == length and covered.all()
            # Each character has a window where a quarter window of context surrounds it,
            # or lies within that distance of the text's own ends.
            for c in range(length):
                margin = max(
                    min(c - s if s else c + size, e - 1 - c if e < length else size)
                    for s, e in wins
                    if s <= c < e
                )
                assert margin >= min(size // 4, c, length - 1 - c)


def test_windows_are_capped():
    wins, truncated = data.text_windows(10_000, 32)
    assert truncated and len(wins) == data.MAX_WINDOWS == 64
    assert wins[-1] == (63 * 15, 63 * 15 + 30)


def _tokenizer(*texts: str) -> CharTokenizer:
    return CharTokenizer.build([TOPIC_FILLER, "张三李四北京上海股票足球", *texts])


def test_training_examples_of_a_long_ner_row():
    rng = random.Random(0)
    text = _filler(rng, 100)
    # Entities across the first window's end (30), the second's start (15) and deep inside.
    entities = [
        {"start": 28, "end": 33, "label": "PER"},
        {"start": 12, "end": 17, "label": "LOC"},
        {"start": 80, "end": 84, "label": "LOC"},
    ]
    row = {"text": text, "entities": entities}
    tok = _tokenizer(text)
    examples = data.examples(NER, tok, [row], 32)
    wins, _ = data.text_windows(100, 32)
    assert len(examples) == len(wins) == 6
    tags = NER.tags
    for (start, end), ex in zip(wins, examples, strict=True):
        got = [tags[t] for t in ex.target[1:-1]]
        assert ex.target[0] == ex.target[-1] == data.IGNORE and len(got) == end - start
        want = ["O"] * (end - start)
        for e in entities:
            for pos in range(max(e["start"], start), min(e["end"], end)):
                want[pos - start] = ("B-" if pos == e["start"] else "I-") + e["label"]
        assert got == want
        # No B- but where an entity really starts.
        starts = {e["start"] - start for e in entities}
        assert all(i in starts for i, t in enumerate(got) if t.startswith("B-"))
    # The first window ends inside PER 28..33: B, I; the third (30..60) continues it: I, I, I.
    assert [tags[t] for t in examples[0].target[29:31]] == ["B-PER", "I-PER"]
    assert [tags[t] for t in examples[2].target[1:5]] == ["I-PER", "I-PER", "I-PER", "O"]


def test_training_examples_of_a_long_classification_row():
    text = "足球" + "的" * 120
    space = data.LabelSpace("text_classification", ("体育", "财经"))
    examples = data.examples(space, _tokenizer(text), [{"text": text, "label": "财经"}], 32)
    assert len(examples) == len(data.text_windows(len(text), 32)[0]) > 1
    assert all(ex.target == 1 and len(ex.enc.input_ids) == 32 for ex in examples)
    # A pair keeps one truncated example.
    pair = data.LabelSpace("text_pair", ("相关", "无关"))
    row = {"text_a": text, "text_b": text, "label": "无关"}
    (only,) = data.examples(pair, _tokenizer(text), [row], 32)
    assert only.enc.truncated and len(only.enc.input_ids) == 32


def _fake_tagger(tok: CharTokenizer, space: data.LabelSpace, noisy_edge: int):
    """Tags 张三 PER and 北京 LOC, everything else O, but ``noisy_edge`` characters at each end of
    a window get a confident wrong B-LOC: pooling must take each character from a window where
    it is far from the edge."""
    tags = {t: i for i, t in enumerate(space.tags)}
    want = {tok.ids["张"]: "B-PER", tok.ids["三"]: "I-PER"}
    want |= {tok.ids["北"]: "B-LOC", tok.ids["京"]: "I-LOC"}
    calls = []

    def run_logits(feed):
        ids = feed["input_ids"]
        calls.append(ids.shape)
        out = np.zeros((*ids.shape, len(space.tags)), dtype="float32")
        for b, row in enumerate(ids):
            n = int((row != tok.pad_id).sum()) - 2
            for p in range(1, n + 1):
                tag = want.get(int(row[p]), "O")
                if p - 1 < noisy_edge or n - p < noisy_edge:
                    tag = "B-LOC"
                out[b, p, tags[tag]] = 5.0
        return out

    return run_logits, calls


@pytest.mark.parametrize("crf", [False, True])
def test_pooled_ner_prediction_merges_windows(crf):
    rng = random.Random(1)
    tok = _tokenizer()
    text = list(_filler(rng, 200))
    gold = []
    for start, word, label in [(28, "张三", "PER"), (44, "北京", "LOC"), (150, "张三", "PER")]:
        text[start : start + 2] = word
        gold.append({"start": start, "end": start + 2, "label": label, "text": word})
    text = "".join(text)
    run_logits, calls = _fake_tagger(tok, NER, noisy_edge=3)
    transitions = np.zeros((len(NER.tags),) * 2) if crf else None
    short = "李四说张三在北京"  # fits a window: read as before
    preds = data.predict(
        run_logits, tok, NER, [text, short], 32, transitions=transitions, batch_size=4
    )
    long, one = preds
    found = [{k: e[k] for k in ("start", "end", "label", "text")} for e in long["entities"]]
    # The fake's noise at the text's own ends stays (no other window reads them); every cut
    # inside the text is read from a window where it is far from the edge.
    assert [e for e in found if 3 <= e["start"] < 197] == gold
    assert [e["start"] for e in found if not 3 <= e["start"] < 197] == [0, 1, 2, 197, 198, 199]
    assert long["windows"] == len(data.text_windows(200, 32)[0]) and not long["truncated"]
    assert "windows" not in one and not one["truncated"]
    assert all(shape[0] <= 4 for shape in calls)  # batch_size counts windows
    assert sum(shape[0] for shape in calls) == long["windows"] + 1


def test_pooled_classification_and_multi_label():
    tok = _tokenizer()
    labels = ("体育", "财经")
    keyword = {tok.ids["足"]: 0, tok.ids["股"]: 1}

    def run_logits(feed):  # a window with a keyword is sure; one without has no idea
        out = np.zeros((len(feed["input_ids"]), 2), dtype="float32")
        for b, row in enumerate(feed["input_ids"]):
            for t in row:
                if int(t) in keyword:
                    out[b, keyword[int(t)]] = 6.0
        return out

    text = "的" * 100 + "股票" + "的" * 100
    single = data.LabelSpace("text_classification", labels)
    (pred,) = data.predict(run_logits, tok, single, [text], 32)
    assert pred["label"] == "财经" and pred["windows"] > 1 and not pred["truncated"]
    assert 0.5 < pred["score"] < 0.9  # the mean with the windows that do not see it

    multi = data.LabelSpace("multi_label", labels)
    run_multi = lambda feed: run_logits(feed) - 3.0  # noqa: E731 (absent: p ≈ 0.05)
    both = "足球" + "的" * 150 + "股票"
    (pred,) = data.predict(run_multi, tok, multi, [both], 32)
    assert pred["labels"] == ["体育", "财经"] and pred["scores"]["体育"] > 0.9

    beyond = "的" * 5000 + "股票"  # past 64 windows: cut, and said so
    (pred,) = data.predict(run_logits, tok, single, [beyond], 32)
    assert pred["truncated"] and pred["windows"] == data.MAX_WINDOWS
    assert pred["scores"]["财经"] == pytest.approx(0.5)


def _long_workdir(root: Path, kind: str, preset: str, pad: int):
    """Rows of ``topic_row`` behind ``pad`` characters of filler: the keyword or the entities
    lie far beyond a max_seq_length of 32."""
    workdir, spec = make_workdir(
        root,
        kind,
        sizes=(160, 32, 24),
        epochs=5,
        batch_size=16,
        learning_rate=5e-3,
        max_seq_length=32,
        early_stopping_patience=0,
    )
    rng = random.Random(f"long-{kind}")
    for split in ("train", "dev", "test"):
        path = workdir / "data" / f"{split}.jsonl"
        rows = []
        for row in data.read_rows(path):
            # Boilerplate (the filler's characters in their order, from anywhere in it): a
            # window of it alone tells no label, as a long document's other parts do not.
            at = rng.randrange(len(TOPIC_FILLER))
            head = (TOPIC_FILLER * 20)[at : at + pad + rng.randint(0, 20)]
            row["text"] = head + row["text"] + _filler(rng, rng.randint(0, 10))
            for e in row.get("entities") or []:
                e["start"] += len(head)
                e["end"] += len(head)
            rows.append(row)
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    spec.backend, spec.preset = "paddle", preset
    spec.save(workdir)
    return workdir


@pytest.mark.parametrize(
    ("kind", "preset", "metric", "floor"),
    [
        # Most windows of a row are boilerplate that carries the row's label into training
        # (the wide part's regression too): far above chance (1/3), short of the NER's floor.
        ("text_classification", "ngram-bag-char", "accuracy", 0.75),
        ("ner", "bigru-crf-char", "f1", 0.8),
    ],
)
def test_paddle_finds_the_signal_beyond_the_maximum_length(tmp_path, kind, preset, metric, floor):
    pytest.importorskip("paddle")
    from runtime.inference import Predictor
    from runtime.run import run

    workdir = _long_workdir(tmp_path, kind, preset, pad=100)
    evaluation = run(workdir)
    assert evaluation["long_rows"] == evaluation["rows"] == 24
    assert evaluation["max_chars"] == 30
    assert evaluation["metrics"][metric] >= floor, evaluation["metrics"]
    rows = data.read_rows(workdir / "data" / "test.jsonl")
    preds = Predictor.load(workdir / "export").predict(rows[:4], batch_size=3)
    assert all(p["windows"] >= 5 and not p["truncated"] for p in preds)
    if kind == "ner":  # offsets on the whole text, far beyond one window
        found = {(e["start"], e["end"], e["label"]) for p in preds for e in p["entities"]}
        gold = {(e["start"], e["end"], e["label"]) for r in rows[:4] for e in r["entities"]}
        assert min(s for s, _, _ in gold) >= 100 and len(found & gold) >= len(gold) - 1
