"""Masked language modelling (objective "mlm", runtime/mlm.py) through the job runner in the
runtime venv: BERT's masking, a tiny ERNIE pretrained on texts labeled or not that lowers its
held-out loss and leaves in best/ what a base-model import accepts, and the torch backend's
refusal."""

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from runtime.spec import Hyperparameters, JobSpec

PHRASES = [
    "今天天气很好",
    "我们一起去公园",
    "他喜欢看足球比赛",
    "这家银行的服务不错",
    "新手机的芯片很快",
]


def _mlm_workdir(tmp_path: Path, **hp) -> tuple[Path, JobSpec]:
    """Texts of a few phrases strung together (a model learns to fill their characters in),
    half of them without a label: pretraining reads every text of every split."""
    rng = random.Random(0)
    (tmp_path / "data").mkdir()
    for split, n in (("train", 160), ("dev", 20), ("test", 20)):
        rows = []
        for i in range(n):
            row = {"text": "，".join(rng.sample(PHRASES, 2))}
            if i % 2:
                row["label"] = "好"
            rows.append(row)
        (tmp_path / "data" / f"{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8"
        )
    values = {"max_seq_length": 32, "checkpoint_steps": 0, "seed": 1, **hp}
    spec = JobSpec(
        job_id=1,
        task_kind="text_classification",
        labels=[],
        backend="paddle",
        objective="mlm",
        preset="ernie-micro-char",
        hyperparameters=Hyperparameters(**values),
    )
    spec.save(tmp_path)
    return tmp_path, spec


def test_masking_is_berts():
    from runtime.mlm import mask_batch
    from runtime.tokenizer import MASK, CharTokenizer

    tok = CharTokenizer.build(["今天我们的这个那些很都也在说看到了一下还是足球篮球"])
    encs = [tok.encode("今天我们的这个那些很都也在说看到了一下还是" * 3, None, 128)] * 200
    feed = mask_batch(encs, tok, 0.15, np.random.default_rng(0))
    picked = feed["labels"] != -100
    chars = len(encs[0].input_ids) - 2
    assert picked.sum(axis=1).min() >= 1
    assert picked.mean() * feed["labels"].shape[1] / chars == pytest.approx(0.15, abs=0.01)
    assert not picked[:, 0].any() and not picked[:, -1].any()  # never [CLS] or [SEP]
    masked = feed["input_ids"][picked] == tok.ids[MASK]
    kept = feed["input_ids"][picked] == feed["labels"][picked]
    assert masked.mean() == pytest.approx(0.8, abs=0.03)
    assert kept.mean() == pytest.approx(0.1 + 0.1 / len(tok.vocab), abs=0.03)


def test_pretraining_lowers_the_held_out_loss_and_leaves_an_importable_encoder(tmp_path):
    from runtime.run import run

    workdir, _spec = _mlm_workdir(
        tmp_path, epochs=20, batch_size=16, learning_rate=2e-3, early_stopping_patience=0
    )
    evaluation = run(workdir)
    before, after = evaluation["initial"], evaluation["metrics"]
    assert evaluation["objective"] == "mlm" and evaluation["split"] == "held_out"
    assert evaluation["texts"] == 200 and evaluation["rows"] >= 1
    assert after["mlm_loss"] < 0.6 * before["mlm_loss"], (before, after)
    assert after["masked_accuracy"] > before["masked_accuracy"] + 0.2
    assert after["perplexity"] < before["perplexity"]
    assert len(evaluation["history"]) == 20
    assert after["mlm_loss"] == min(h["mlm_loss"] for h in evaluation["history"])  # the best
    assert json.loads((workdir / "evaluation.json").read_text("utf-8")) == evaluation
    assert not (workdir / "export").exists()

    # best/ in PaddleNLP's layout: what a base-model import accepts and a classifier loads.
    best = workdir / "best"
    for name in ("model.safetensors", "config.json", "vocab.txt", "tokenizer_config.json"):
        assert (best / name).is_file(), name
    config = json.loads((best / "config.json").read_text("utf-8"))
    assert config["model_type"] == "ernie" or config["architectures"][0].startswith("Ernie")
    from paddlenlp.transformers import ErnieForMaskedLM, ErnieForSequenceClassification

    from runtime.backends.paddle import load_paddle_weights

    pretrained = load_paddle_weights(best)
    classifier = ErnieForSequenceClassification.from_pretrained(
        str(best), num_classes=3, use_safetensors=True
    )
    loaded = classifier.state_dict()
    name = "ernie.embeddings.word_embeddings.weight"
    assert np.allclose(loaded[name].numpy(), pretrained[name])
    assert ErnieForMaskedLM.from_pretrained(str(best), use_safetensors=True) is not None


def test_the_torch_backend_says_it_does_not_pretrain(tmp_path):
    from runtime.run import run

    workdir, spec = _mlm_workdir(tmp_path, epochs=1)
    (workdir / "spec.json").unlink()
    replace(spec, backend="torch").save(workdir)
    with pytest.raises(NotImplementedError, match="does not pretrain"):
        run(workdir)
