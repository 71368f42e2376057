"""The torch backend end to end, in-process: train, export to ONNX, evaluate the export through
the onnxruntime Predictor (no Django, no database; skipped where torch is not installed)."""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

import onnxruntime as ort

import runtime.run as runner
from runtime import data
from runtime.backends import get_backend
from runtime.backends.torch import TorchBackend, TorchOps, check_checkpoint
from runtime.inference import Predictor, read_manifest
from runtime.loop import BEST, predict_rows
from runtime.spec import JobSpec
from runtime.tokenizer import CharTokenizer
from tests.helpers.workdir import TOPIC_LABELS, make_workdir

CLASSIFICATION_KEYS = {"accuracy", "macro_f1", "micro_f1", "weighted_f1", "per_label", "support"}
METRIC_KEYS = {
    "text_classification": CLASSIFICATION_KEYS | {"confusion"},
    "text_pair": CLASSIFICATION_KEYS | {"confusion"},
    "multi_label": CLASSIFICATION_KEYS | {"label_confusion"},
    "ner": CLASSIFICATION_KEYS | {"precision", "recall", "f1"},
}


@pytest.fixture
def events(monkeypatch) -> list[tuple[str, dict]]:
    seen: list[tuple[str, dict]] = []
    monkeypatch.setattr(runner, "emit", lambda kind, **d: seen.append((kind, d)))
    return seen


def torch_ops(spec: JobSpec, workdir: Path) -> TorchOps:
    tokenizer = CharTokenizer.from_file(workdir / BEST / "vocab.txt")
    ops = TorchOps()
    ops.build(spec, data.LabelSpace(spec.task_kind, tuple(spec.labels)), len(tokenizer.vocab))
    ops.load(workdir / BEST, with_optimizer=False)
    return ops


def without_scores(pred: dict) -> dict:
    """A prediction's decisions (label, labels, entity spans), not its float scores."""
    if "entities" in pred:
        return {"entities": [(e["start"], e["end"], e["label"]) for e in pred["entities"]]}
    return {k: v for k, v in pred.items() if k in ("label", "labels")}


@pytest.mark.parametrize("kind", ["text_classification", "multi_label", "ner", "text_pair"])
def test_train_export_evaluate(tmp_path: Path, events, kind: str) -> None:
    # Every epoch (counted below): no early stopping.
    workdir, spec = make_workdir(tmp_path, kind, early_stopping_patience=0)
    evaluation = runner.run(workdir)

    export = workdir / "export"
    manifest = read_manifest(export)
    assert manifest["runtime"] == "onnxruntime" and manifest["backend"] == "torch"
    assert manifest["model_file"] == "model.onnx"
    assert set(manifest["files"]) == {"model.onnx", "vocab.txt"}
    assert manifest["task_kind"] == kind and manifest["labels"] == TOPIC_LABELS[kind]

    saved = json.loads((workdir / "evaluation.json").read_text(encoding="utf-8"))
    assert saved["split"] == "test" and saved["rows"] == 24
    assert METRIC_KEYS[kind] <= set(saved["metrics"])
    assert saved["steps"] == 12 * 10
    # Learnable: a keyword decides the annotation.
    score = saved["metrics"]["f1" if kind == "ner" else "micro_f1"]
    assert score >= 0.9, saved["metrics"]
    assert evaluation["metrics"] == saved["metrics"]
    assert [k for k, _ in events].count("metrics") == 10 + 1  # each epoch on dev, then test

    # The graph takes the named int64 inputs with dynamic batch and sequence axes.
    session = ort.InferenceSession(str(export / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    assert set(inputs) == {"input_ids", "token_type_ids", "attention_mask"}
    assert all(i.type == "tensor(int64)" and len(i.shape) == 2 for i in inputs.values())
    assert all(isinstance(d, str) for i in inputs.values() for d in i.shape)
    assert [o.name for o in session.get_outputs()] == ["logits"]

    # onnxruntime and the in-memory torch model agree, on a batch with padding.
    rows = data.read_rows(workdir / "data" / "test.jsonl")
    tokenizer = CharTokenizer.from_file(export / "vocab.txt")
    space = data.LabelSpace(kind, tuple(spec.labels))
    encs = [data.encode(tokenizer, kind, r, spec.hp.max_seq_length) for r in rows]
    feed = data.collate([data.Example(e, None) for e in encs], tokenizer.pad_id)
    assert (feed["attention_mask"] == 0).any()
    ops = torch_ops(spec, workdir)
    expected = ops.logits(feed)
    got = session.run(None, {name: feed[name] for name in inputs})[0]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    real = feed["attention_mask"].astype(bool)
    if space.head == data.TOKEN:
        assert (got.argmax(-1)[real] == expected.argmax(-1)[real]).all()
    else:
        assert (got.argmax(-1) == expected.argmax(-1)).all()

    served = Predictor.load(export).predict(rows)
    trained = predict_rows(ops, space, tokenizer, rows, spec.hp.max_seq_length, spec.hp.threshold)
    assert [without_scores(p) for p in served] == [without_scores(p) for p in trained]


def test_resume_from_checkpoint(tmp_path: Path, events) -> None:
    workdir, spec = make_workdir(
        tmp_path, "text_classification", sizes=(48, 8, 8), epochs=1, checkpoint_steps=2
    )
    runner.run(workdir)
    saved = [d["step"] for k, d in events if k == "checkpoint"]
    assert saved == [2, 4, 6]  # every 2 steps within the epoch, then at its end
    assert "resumed" not in [k for k, _ in events]
    # The optimizer's state as safetensors and JSON: nothing the runner reads is a pickle.
    assert (workdir / "checkpoint" / "optimizer.safetensors").is_file()
    assert (workdir / "checkpoint" / "optimizer.json").is_file()
    assert (workdir / "checkpoint" / "model.safetensors").is_file()

    spec.hyperparameters.epochs = 2
    spec.save(workdir)
    events.clear()
    evaluation = runner.run(workdir)
    resumed = [d for k, d in events if k == "resumed"]
    assert resumed == [{"step": 6, "epoch": 1}]
    first_loss = next(d for k, d in events if k == "loss")
    assert first_loss["step"] > 6  # epoch 1 was not trained again
    assert evaluation["steps"] == 12
    assert [h["epoch"] for h in evaluation["history"]] == [1, 2]


def test_resume_mid_epoch_after_a_kill(tmp_path: Path, events, monkeypatch) -> None:
    """A worker killed after step 5 goes on from the checkpoint of step 4 with the same
    optimizer state, and the epoch's remaining batches only."""
    workdir, _spec = make_workdir(
        tmp_path, "multi_label", sizes=(48, 8, 8), epochs=1, checkpoint_steps=2
    )
    step = TorchOps.train_step
    calls = {"n": 0}

    def dying(self, batch, lr):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # stands for the kill
        return step(self, batch, lr)

    monkeypatch.setattr(TorchOps, "train_step", dying)
    with pytest.raises(KeyboardInterrupt):
        runner.run(workdir)
    monkeypatch.setattr(TorchOps, "train_step", step)
    events.clear()
    evaluation = runner.run(workdir)
    assert [d for k, d in events if k == "resumed"] == [{"step": 4, "epoch": 0}]
    assert evaluation["steps"] == 6
    assert next(d["step"] for k, d in events if k == "loss") == 5


@pytest.mark.parametrize("model_type", ["bert", "ernie"])
def test_imported_base_model(tmp_path: Path, events, model_type: str) -> None:
    """A Hugging Face checkpoint in base_model_dir (with a head of another size) fine-tunes
    through the Auto classes and exports."""
    from transformers import BertConfig, BertForSequenceClassification, ErnieConfig, ErnieModel

    workdir, spec = make_workdir(tmp_path, "text_classification", sizes=(24, 8, 8), epochs=2)
    base = tmp_path / "base"
    texts = (r["text"] for r in data.read_rows(workdir / "data" / "train.jsonl"))
    tokenizer = CharTokenizer.build(texts)
    arch = {
        "vocab_size": len(tokenizer.vocab),
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    }
    if model_type == "bert":  # a checkpoint with a 2-label head: replaced by a 3-label one
        BertForSequenceClassification(BertConfig(num_labels=2, **arch)).save_pretrained(base)
    else:  # an encoder only, with ERNIE 3.0's task-type embedding
        ErnieModel(ErnieConfig(use_task_id=True, **arch)).save_pretrained(base)
    tokenizer.save(base / "vocab.txt")
    spec.preset, spec.base_model_dir = None, str(base)
    spec.save(workdir)

    evaluation = runner.run(workdir)
    config = json.loads((workdir / BEST / "config.json").read_text())
    assert config["model_type"] == model_type and len(config["id2label"]) == 3
    assert read_manifest(workdir / "export")["model_file"] == "model.onnx"
    assert evaluation["rows"] == 8 and "accuracy" in evaluation["metrics"]


def test_entry_point_and_errors(tmp_path: Path) -> None:
    backend = get_backend("torch")
    assert isinstance(backend, TorchBackend)
    assert (backend.name, backend.runtime) == ("torch", "onnxruntime")

    _workdir, spec = make_workdir(tmp_path, "text_classification", sizes=(1, 0, 0))
    spec.device_type = spec.device = "npu"
    space = data.LabelSpace(spec.task_kind, tuple(spec.labels))
    with pytest.raises(ValueError, match="'npu'"):
        TorchOps().build(spec, space, 10)

    paddle_like = tmp_path / "paddle_model"
    paddle_like.mkdir()
    (paddle_like / "config.json").write_text("{}")
    (paddle_like / "model_state.pdparams").write_bytes(b"")
    with pytest.raises(ValueError, match="not a Hugging Face checkpoint"):
        check_checkpoint(paddle_like)
