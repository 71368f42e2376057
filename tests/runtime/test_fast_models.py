"""The fast presets of CPU nodes (runtime.backends.paddle_models) end to end, in-process: the
real runner trains, exports for Paddle Inference and evaluates each task kind; the export
predicts what the trained model predicted; the CRF's path never breaks BIO."""

import json
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("paddle")

import runtime.run as runner
from runtime import data
from runtime.backends import paddle_models
from runtime.backends.paddle import PaddleOps
from runtime.inference import MANIFEST, Predictor, read_manifest, sha256_file
from runtime.loop import BEST, load_split, predict_rows
from runtime.presets import FAST_PRESETS, default_preset, presets_for, recommended
from runtime.spec import JobSpec
from runtime.tokenizer import CharTokenizer
from tests.helpers.workdir import make_workdir

PRESET = {
    "text_classification": "ngram-bag-char",
    "multi_label": "ngram-bag-char",
    "text_pair": "ngram-bag-char",
    "ner": "bigru-crf-char",
}


def _decisions(pred: dict):
    if "entities" in pred:
        return [(e["start"], e["end"], e["label"]) for e in pred["entities"]]
    return pred.get("label") or sorted(pred["labels"])


@pytest.mark.parametrize("kind", list(PRESET))
def test_a_fast_preset_trains_exports_and_serves_what_it_learned(tmp_path: Path, kind, monkeypatch):
    monkeypatch.setattr(runner, "emit", lambda *a, **k: None)
    hp = recommended(kind, preset=PRESET[kind])
    workdir, spec = make_workdir(
        tmp_path, kind, sizes=(160, 30, 40), learning_rate=hp.learning_rate, max_seq_length=32
    )
    spec.backend, spec.preset = "paddle", PRESET[kind]
    spec.save(workdir)
    evaluation = runner.run(workdir)

    metric = "f1" if kind == "ner" else "micro_f1"
    assert evaluation["metrics"][metric] >= 0.9, evaluation["metrics"]
    config = json.loads((workdir / BEST / paddle_models.CONFIG).read_text("utf-8"))
    assert config["architecture"] == FAST_PRESETS[PRESET[kind]]["architecture"]
    manifest = read_manifest(workdir / "export")
    assert manifest["runtime"] == "paddle_inference"
    assert ("crf_file" in manifest) == (kind == "ner")

    # The export (Paddle Inference) decides as the trained model did, row by row.
    rows = load_split(workdir, "test", kind)
    ops = PaddleOps()
    tokenizer = CharTokenizer.from_file(workdir / BEST / "vocab.txt")
    space = data.LabelSpace(kind, tuple(spec.labels))
    train = load_split(workdir, "train", kind)  # they size the wide table, as in the job
    ops.size_to(data.examples(space, tokenizer, train, spec.hp.max_seq_length))
    ops.build(JobSpec.load(workdir), space, len(tokenizer.vocab))
    ops.load(workdir / BEST, with_optimizer=False)
    trained = predict_rows(ops, space, tokenizer, rows, spec.hp.max_seq_length, 0.5)
    served = Predictor.load(workdir / "export").predict(rows)
    assert [_decisions(p) for p in served] == [_decisions(p) for p in trained]
    # Its ONNX target (paddle2onnx, served by ONNX Runtime) decides the same.
    assert evaluation["targets"]["onnx"]["status"] == "ready", evaluation["targets"]
    assert evaluation["targets"]["onnx"]["agreement"] == 1.0
    onnx = Predictor.load(workdir / "targets" / "onnx")
    assert onnx.manifest["runtime"] == "onnxruntime"
    assert [_decisions(p) for p in onnx.predict(rows)] == [_decisions(p) for p in trained]

    if kind == "ner":  # crf.json comes with an uploaded export: read within a matrix's size
        crafted = workdir / "export" / manifest["crf_file"]
        crafted.write_text("[" + "0," * 100_000 + "0]")
        manifest["files"][crafted.name] = sha256_file(crafted)
        (workdir / "export" / MANIFEST).write_text(json.dumps(manifest), "utf-8")
        with pytest.raises(ValueError, match="larger than a 5×5 matrix"):
            Predictor.load(workdir / "export")


def test_the_viterbi_path_follows_bio_and_the_transitions():
    tags = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
    # Alone, each character's best tag would be O, I-PER, I-PER: an entity without its B.
    emissions = np.array([[2.0, 0, 0, 0, 0], [0, 0, 3.0, 0, 0], [0, 0, 3.0, 0, 0]])
    path = data.viterbi(emissions, np.zeros((5, 5)), tags)
    assert [tags[i] for i in path] != ["O", "I-PER", "I-PER"]
    assert all(
        not tags[b].startswith("I-") or tags[a][2:] == tags[b][2:] for a, b in pairwise(path)
    )
    assert not tags[path[0]].startswith("I-")
    # Transitions that favour B-LOC → I-LOC over staying outside win over weak emissions.
    trans = np.zeros((5, 5))
    trans[3, 4] = 5.0
    path = data.viterbi(np.array([[0, 0, 0, 1.0, 0], [1.0, 0, 0, 0, 0]]), trans, tags)
    assert [tags[i] for i in path] == ["B-LOC", "I-LOC"]
    assert len(data.viterbi(np.zeros((0, 5)), trans, tags)) == 0


def test_the_default_preset_depends_on_the_kind_and_the_device():
    assert default_preset("text_classification") == "ngram-bag-char"
    assert default_preset("text_pair") == "ngram-bag-char"
    assert default_preset("ner") == "bigru-crf-char"
    assert default_preset("ner", accelerated=True) == "ernie-tiny-char"
    assert default_preset("ner", devices=2) == "ernie-micro-char"
    assert default_preset("ner", backend="torch") == "ernie-micro-char"
    assert "bigru-crf-char" not in presets_for("text_classification")
    assert "ngram-bag-char" not in presets_for("text_classification", "torch")
    assert default_preset("instruction") == "llama-tiny-char"


def test_the_wide_part_hashes_in_numpy_as_in_the_graph():
    import paddle

    ids = np.array([2, 57, 301, 4, 57, 301, 3], dtype="int64")
    padded = paddle.to_tensor(np.concatenate([ids, [0, 0]])[None, :])
    for n in paddle_models.WIDE_ORDERS:
        offsets = paddle_models._ending_at(n)
        graph = paddle_models._gram_ids(padded, offsets, 1000, n).numpy()[0, : len(ids)]
        assert (paddle_models._np_gram_ids(ids, offsets, 1000, n) == graph).all()
    # Warm start: IDF (an n-gram in every row weighs least), then the logistic regression,
    # so that before any step the model already tells the classes apart.
    model = paddle_models.build(
        {"architecture": "ngram_bag", "vocab_size": 400, "num_labels": 2, "wide_buckets": 1000}
    )
    rows = [[2, 57, 9, 3], [2, 57, 57, 8, 3], [2, 301, 9, 3], [2, 301, 8, 3]] * 5
    model.warm_start(rows, [0, 0, 1, 1] * 5, "single")
    idf = model.idf.numpy()[:, 0]
    common = paddle_models._np_gram_ids(np.array([2]), (0,), 1000, 1)[0]
    rare = paddle_models._np_gram_ids(np.array([301]), (0,), 1000, 1)[0]
    assert idf[common] < idf[rare]
    model.eval()
    logits = model(paddle.to_tensor(np.array([[2, 57, 8, 3], [2, 301, 9, 3]]))).numpy()
    assert list(logits.argmax(axis=1)) == [0, 1]
    # Characters never seen in training (and an n-gram of one training row) weigh nothing:
    # the wide part scores a row with them as it scores the row without them.
    wide = paddle.to_tensor(np.array([[2, 301, 9, 3, 0, 0], [2, 301, 9, 3, 77, 78]]))
    scores = model._wide(wide, (wide != 0).astype("float32")).numpy()
    assert np.allclose(scores[0], scores[1], atol=1e-5)
    model.warm_start([*rows, [2, 99, 3]], [0, 0, 1, 1] * 5 + [1], "single")
    assert model.idf.numpy()[paddle_models._np_gram_ids(np.array([99]), (0,), 1000, 1)[0], 0] == 0


def test_a_two_way_wide_part_is_the_regression_plus_nbsvm_in_the_graph():
    """The wide part of a two-way decision: the baseline's logistic regression plus one over
    the naive-Bayes-scaled features, folded into one table that the graph reads; the graph's
    logits are the two regressions' decision values summed, row by row."""
    import paddle
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression

    from runtime.baselines import LR_C, NB_LR_C

    rng = np.random.default_rng(0)
    rows = [[2, *rng.integers(4, 60, size=rng.integers(3, 12)).tolist(), 3] for _ in range(120)]
    labels = [int(sum(r) % 3 == 0 or 5 in r) for r in rows]
    model = paddle_models.build(
        {"architecture": "ngram_bag", "vocab_size": 80, "num_labels": 2, "wide_buckets": 1 << 16}
    )
    model.warm_start(rows, labels, "single")

    # The features as the graph reads them: each occurrence's IDF, over the root of the sum
    # of their squares.
    idf = model.idf.numpy()[:, 0].astype("float64")
    x = sparse.lil_matrix((len(rows), 1 << 16))
    for i, r in enumerate(rows):
        grams = model._np_grams(np.asarray(r))
        for g in grams:
            x[i, g] += idf[g] / np.sqrt((idf[grams] ** 2).sum())
    x = sparse.csr_matrix(x)[:, np.flatnonzero(idf)]  # the regressions see the weighing buckets
    y = np.array(labels)
    ratio = paddle_models._nb_ratio(x, y == 1)
    expected = LogisticRegression(C=LR_C, max_iter=1000).fit(x, y).decision_function(x)
    scaled = x @ sparse.diags(ratio)
    expected += (
        LogisticRegression(C=NB_LR_C, max_iter=1000).fit(scaled, y).decision_function(scaled)
    )

    model.eval()
    width = max(len(r) for r in rows)
    padded = np.array([r + [0] * (width - len(r)) for r in rows])
    logits = model(paddle.to_tensor(padded)).numpy()
    assert np.allclose(logits[:, 1] - logits[:, 0], expected, atol=1e-3)
    assert ((logits[:, 1] > logits[:, 0]) == y).mean() > 0.9


def test_the_deep_part_trains_beside_wide_logits_held_out_of_the_solve():
    """In training a row's wide logits come from a solve on the other folds' rows, which never
    saw its label (the whole solve fits the training rows almost perfectly and would leave the
    deep part nothing to learn): the loss adds them to the deep part's logits. Evaluation and
    the export read the whole solve."""
    import paddle
    import paddle.nn.functional as F

    rng = np.random.default_rng(1)
    rows = [[2, *rng.integers(4, 60, size=rng.integers(3, 12)).tolist(), 3] for _ in range(150)]
    labels = [int((5 in r) != (rng.random() < 0.2)) for r in rows]  # a signal, 20 % noise
    config = {"architecture": "ngram_bag", "vocab_size": 80, "num_labels": 2, "dropout": 0.0}
    model = paddle_models.build({**config, "wide_buckets": 1 << 16})
    assert "held-out" in model.warm_start(rows, labels, "single")
    width = max(len(r) for r in rows)
    ids = paddle.to_tensor(np.array([r + [0] * (width - len(r)) for r in rows]))
    whole = model._wide(ids, (ids != 0).astype("float32")).numpy()
    held = np.stack([model.held_out[paddle_models._row_key(r)] for r in ids.numpy()])
    y = np.array(labels)
    assert (held.argmax(axis=1) == y).mean() < (whole.argmax(axis=1) == y).mean()

    # A row's held-out logits do not move with its own label (but for the solver's tolerance);
    # the whole solve's do.
    assert model.warm_start(rows, [1 - labels[0], *labels[1:]], "single")
    again = model.held_out[paddle_models._row_key(rows[0])]
    moved = model._wide(ids[:1], (ids[:1] != 0).astype("float32")).numpy()[0]
    assert abs(np.diff(again - held[0])[0]) < 0.2 < 1.0 < abs(np.diff(moved - whole[0])[0])
    model.warm_start(rows, labels, "single")

    model.out.weight.set_value(rng.normal(size=model.out.weight.shape).astype("float32"))
    model.train()
    deep = model(ids)  # the deep part alone
    target = paddle.to_tensor(y)
    loss = model.loss(deep, target, ids, lambda out: F.cross_entropy(out, target))
    expected = F.cross_entropy(deep + paddle.to_tensor(held), target)
    assert np.isclose(float(loss), float(expected), rtol=1e-5)
    # A row the solve never held out (past its rows) is scored with the whole solve's logits.
    new = paddle.to_tensor(np.array([[2, 5, 7, 3]]))
    out = model(new)
    assert np.isclose(
        float(model.loss(out, target[:1], new, lambda o: F.cross_entropy(o, target[:1]))),
        float(F.cross_entropy(out + model._wide(new, (new != 0).astype("float32")), target[:1])),
        rtol=1e-5,
    )
    model.eval()
    assert np.allclose(model(ids).numpy(), deep.numpy() + whole, atol=1e-4)


def test_a_classifiers_wide_table_is_sized_to_its_training_ngrams():
    """A vocabulary's room without shipping one: ``WIDE_LOAD`` buckets for each distinct
    n-gram of the training rows, a power of two, at most the preset's and within the table's
    bound for the labels' number."""
    rng = np.random.default_rng(0)
    few = [[2, 5, 6, 3]] * 10
    assert paddle_models.sized_buckets(few, 1 << 22, 2) == paddle_models.WIDE_MIN_BUCKETS
    many = [rng.integers(4, 3000, size=50).tolist() for _ in range(400)]  # ~60 k n-grams
    grams = {
        tuple(r[i : i + n]) for r in many for n in paddle_models.WIDE_ORDERS for i in range(51 - n)
    }
    sized = paddle_models.sized_buckets(many, 1 << 22, 2)
    assert sized & (sized - 1) == 0  # a power of two
    assert paddle_models.WIDE_LOAD * len(grams) <= sized < 2 * paddle_models.WIDE_LOAD * len(grams)
    assert paddle_models.sized_buckets(many, 1 << 16, 2) == 1 << 16
    assert paddle_models.sized_buckets(many, 1 << 22, 500) * 500 <= paddle_models.WIDE_TABLE_MAX


def test_a_taggers_wide_part_is_the_less_regularised_crf_in_the_graph():
    """The tagger's wide part: crfsuite's solution over the hashed character features, at the
    wide part's regularisation (not the baseline's): each character's tag scores in the graph
    are the sum of its features' weights, and the CRF's transitions are crfsuite's."""
    import paddle

    from runtime.baselines import WIDE_CRF_C1, WIDE_CRF_C2, linear_chain_crf

    rng = np.random.default_rng(0)
    rows, tags = [], []
    for _ in range(60):  # tag 1 (B) then 2 (I): the two characters after a 5
        chars = rng.integers(6, 40, size=rng.integers(4, 12)).tolist()
        at = int(rng.integers(0, len(chars) - 2))
        chars[at] = 5
        rows.append([2, *chars, 3])
        tags.append(
            [
                -100,
                *[1 if i == at + 1 else 2 if i == at + 2 else 0 for i in range(len(chars))],
                -100,
            ]
        )
    buckets = 1 << 16
    model = paddle_models.build(
        {"architecture": "bigru_crf", "vocab_size": 50, "num_labels": 3, "wide_buckets": buckets}
    )
    assert model.warm_start(rows, tags, "token")

    def features(row: list[int]) -> list[dict[str, float]]:
        ids = np.asarray(row)
        grams = [
            paddle_models._np_gram_ids(ids, offsets, buckets, salt)[1:-1]
            for salt, offsets in paddle_models.CRF_TEMPLATES
        ]
        return [{str(int(g[t])): 1.0 for g in grams} for t in range(len(row) - 2)]

    crf = linear_chain_crf(WIDE_CRF_C1, WIDE_CRF_C2)
    crf.fit([features(r) for r in rows], [[str(t) for t in row[1:-1]] for row in tags])
    model.eval()
    for row in rows[:10]:
        emissions = model(paddle.to_tensor(np.array([row]))).numpy()[0, 1:-1]
        expected = np.zeros_like(emissions)
        for t, feats in enumerate(features(row)):
            for attr in feats:
                for tag in range(3):
                    expected[t, tag] += crf.state_features_.get((attr, str(tag)), 0.0)
        assert np.allclose(emissions, expected, atol=1e-4)
    transitions = np.zeros((3, 3))
    for (a, b), value in crf.transition_features_.items():
        transitions[int(a), int(b)] = value
    assert np.allclose(model.transitions(), transitions, atol=1e-5)


def test_an_export_converts_the_code_the_job_loaded_though_an_upgrade_replaced_its_file(
    tmp_path: Path, monkeypatch
):
    """Paddle's export reads a layer's ``forward`` from its file at the end of the job: a file
    replaced meanwhile (an upgrade under a running job) must neither fail the export nor
    change what it computes."""
    import importlib
    import os

    import paddle
    from paddle.static import InputSpec

    from runtime.backends.paddle import pin_sources

    source = tmp_path / "upgraded_model.py"
    code = "from paddle import nn\n\n\nclass Net(nn.Layer):\n    def forward(self, x):\n"
    source.write_text(code + "        return x * 2.0\n", "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = importlib.import_module("upgraded_model").Net()
    pin_sources(model)
    source.write_text("# a newer release\n\n" + code + "        return x * 3.0\n", "utf-8")
    later = source.stat().st_mtime + 10
    os.utime(source, (later, later))

    model.eval()
    static = paddle.jit.to_static(model, input_spec=[InputSpec([None, 2], "float32")])
    paddle.jit.save(static, str(tmp_path / "export" / "inference"))
    exported = paddle.jit.load(str(tmp_path / "export" / "inference"))
    assert exported(paddle.ones([1, 2])).numpy().tolist() == [[2.0, 2.0]]


_DENORMALS = """
import threading
import numpy as np
import paddle
from runtime.inference import flush_denormals

tiny = np.float32(1e-39)  # below float32's smallest normal number (1.2e-38)
out = {"before": float((paddle.to_tensor([tiny]) * 1.0).numpy()[0])}
out["flushed"] = flush_denormals()
out["after"] = float((paddle.to_tensor([tiny]) * 1.0).numpy()[0])
def later():
    out["thread"] = float(np.float32(tiny) * np.float32(1.0))
thread = threading.Thread(target=later)
thread.start()
thread.join()
print(out)
"""


def test_a_paddle_job_takes_denormal_floats_as_zero_in_its_threads_too():
    """Weights that Adam drives through the denormal range made each step of a fast model
    five times slower on real reviews: a job's process flushes them (``PaddleOps.build``), and
    so does a Paddle Inference predictor's (``runtime.inference``)."""
    import ast
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _DENORMALS], capture_output=True, text=True, check=True
    )
    out = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert out["before"] == pytest.approx(1e-39, rel=1e-3)  # kept, slowly, by default
    assert out["flushed"] is True
    assert out["after"] == 0.0 and out["thread"] == 0.0
