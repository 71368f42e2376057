"""Compression end to end, in-process: a real model trained by the runner, then quantized by a
job of objective "int8" from its files in ``parent/`` (runtime.compress: an ONNX Runtime export
that decides as its parent did, smaller), or distilled into a fast preset by a job of
objective "distill" (runtime.distill); each report beside the parent's."""

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("paddle")

import runtime.run as runner
from runtime import data
from runtime.compress import PARENT_DIR, onnx_form
from runtime.inference import Predictor, read_manifest
from runtime.presets import recommended
from runtime.spec import JobSpec
from runtime.targets import TARGETS_DIR
from tests.helpers.workdir import make_workdir


def _trained(tmp_path: Path, kind: str, backend: str, preset: str) -> Path:
    workdir, spec = make_workdir(
        tmp_path / "train", kind, sizes=(160, 30, 40), max_seq_length=32, epochs=4
    )
    spec.backend, spec.preset = backend, preset
    spec.save(workdir)
    runner.run(workdir)
    return workdir


@pytest.mark.parametrize(
    ("kind", "backend", "preset", "mode"),
    [
        ("text_classification", "paddle", "ernie-micro-char", "dynamic"),
        ("ner", "paddle", "bigru-crf-char", "static"),
        ("text_pair", "torch", "ernie-micro-char", "dynamic"),
    ],
)
def test_a_model_quantized_to_int8_decides_as_its_parent(
    tmp_path: Path, monkeypatch, kind, backend, preset, mode
):
    monkeypatch.setattr(runner, "emit", lambda *a, **k: None)
    trained = _trained(tmp_path, kind, backend, preset)

    workdir = tmp_path / "compress"
    shutil.copytree(trained / "data", workdir / "data")
    shutil.copytree(trained / "export", workdir / PARENT_DIR / "export")
    if (trained / TARGETS_DIR).exists():
        shutil.copytree(trained / TARGETS_DIR, workdir / PARENT_DIR / TARGETS_DIR)
    spec = JobSpec.load(trained)
    spec.objective = "int8"
    spec.hp.quantization, spec.hp.calibration_rows = mode, 20
    spec.save(workdir)
    evaluation = runner.run(workdir)

    manifest = read_manifest(workdir / "export")
    assert manifest["runtime"] == "onnxruntime" and manifest["quantization"] == f"int8-{mode}"
    compression = evaluation["compression"]
    assert compression["params"]["mode"] == mode
    assert compression["agreement"] >= 0.9, compression
    assert abs(compression["metric_delta"]["micro_f1"]) <= 0.1, compression
    # INT8 weights: well under half the size of the FP32 ONNX form.
    assert compression["size"]["model"] < 0.5 * compression["size"]["parent_onnx"], compression
    for model in ("model", "parent", "parent_onnx"):
        figures = compression["latency"][model]
        assert figures["b1_ms"] > 0 and figures["b32_rows_per_s"] > 0
    assert onnx_form(workdir / PARENT_DIR).name in ("export", "onnx")
    # The compressed export serves like any: the report's predictions are its own.
    rows = [m["row"] for m in evaluation["mistakes"]][:5]
    served = Predictor.load(workdir / "export").predict(rows)
    assert [p for p in served] == [m["predicted"] for m in evaluation["mistakes"]][:5]


def test_a_student_learns_what_its_teacher_decides_on_the_unlabeled_rows_too(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setattr(runner, "emit", lambda *a, **k: None)
    kind = "text_classification"
    trained = _trained(tmp_path, kind, "paddle", "ernie-micro-char")

    workdir = tmp_path / "distill"
    shutil.copytree(trained / "data", workdir / "data")
    # Unlabeled rows of the dataset (in its dev split): the teacher labels them for the student.
    unlabeled = [{"text": r["text"]} for r in data.read_rows(trained / "data" / "train.jsonl")]
    with open(workdir / "data" / "dev.jsonl", "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in unlabeled[:30])
    shutil.copytree(trained / "export", workdir / PARENT_DIR / "export")
    spec = JobSpec.load(trained)
    spec.objective, spec.preset = "distill", "ngram-bag-char"
    spec.hyperparameters = recommended(kind, preset="ngram-bag-char")
    spec.hp.max_seq_length = 32
    spec.save(workdir)
    evaluation = runner.run(workdir)

    figures = evaluation["compression"]
    assert figures["method"] == "distill" and figures["params"]["student"] == "ngram-bag-char"
    assert figures["params"]["unlabeled_rows"] == 30
    assert figures["params"]["rows"] == 160 + 30
    assert figures["agreement"] >= 0.9, figures
    assert evaluation["metrics"]["accuracy"] >= 0.9, evaluation["metrics"]
    assert set(figures["latency"]) == {"model", "parent"}
    # The gold training rows are kept aside; the split the student learned from is labelled.
    gold = data.read_rows(workdir / "data" / "train.gold.jsonl")
    learned = data.read_rows(workdir / "data" / "train.jsonl")
    assert len(gold) == 160 and len(learned) == 190 and all(r.get("label") for r in learned)
    # ... with the teacher's scores, which the student learnt as a distribution.
    assert all(set(r[data.SOFT]) == set(spec.labels) for r in learned)
    assert all(r["label"] == max(r[data.SOFT], key=r[data.SOFT].get) for r in learned)


def test_a_teachers_scores_are_a_target_only_where_they_are_probabilities_of_the_labels():
    space = data.LabelSpace("text_classification", ("正面", "负面"))
    row = {"text": "好", "label": "正面", data.SOFT: {"正面": 0.6, "负面": 0.2}}
    assert data.soft_target(space, row).tolist() == pytest.approx([0.75, 0.25])
    for scores in ({"正面": 0.6}, {"正面": 1.5, "负面": 0.0}, {"正面": float("nan"), "负面": 1}):
        with pytest.raises(ValueError, match=data.SOFT):
            data.soft_target(space, {**row, data.SOFT: scores})
    multi = data.LabelSpace("multi_label", ("甲", "乙"))
    assert data.soft_target(multi, {data.SOFT: {"甲": 0.9, "乙": 0.8}}).tolist() == pytest.approx(
        [0.9, 0.8]
    )
    tagger = data.LabelSpace("ner", ("人名",))
    assert data.soft_target(tagger, {data.SOFT: {"x": 2}}) is None
    # A batch of soft and hard targets: the hard ones one-hot, every row a distribution.
    tok_row = data.Example(data.Encoded([1, 5, 2], [0, 0, 0], (1, 0), False), 1)
    soft_row = data.Example(tok_row.enc, data.soft_target(space, row))
    labels = data.collate([tok_row, soft_row], 0, data.SINGLE)["labels"]
    assert labels.dtype == "float32"
    assert labels.ravel().tolist() == pytest.approx([0, 1, 0.75, 0.25])
