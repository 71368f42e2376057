"""The lite target (runtime.lite): a trained export (a fast model's or an ERNIE's) converted
to Paddle Lite's ``model.nb`` in the lite venv (Python 3.10, paddlelite), run by Paddle Lite's
x86 runtime and deciding as the Paddle Inference export decides; an operator Paddle Lite lacks
fails the target with its name; a node without the lite venv fails it saying so."""

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("paddle")

import runtime.run as runner
from runtime import lite
from runtime.inference import Predictor, read_manifest, write_manifest
from runtime.loop import load_split
from runtime.presets import recommended
from runtime.targets import TargetError, decision, make_targets
from tests.helpers.workdir import make_workdir

# The models the lite venv rebuilds: the fast presets and ERNIE, for a label and for tags.
MODELS = {
    "fast-classifier": ("text_classification", "ngram-bag-char"),
    "fast-tagger": ("ner", "bigru-crf-char"),
    "ernie-classifier": ("text_classification", "ernie-micro-char"),
    "ernie-tagger": ("ner", "ernie-micro-char"),
}
# Small tables: the conversion and the test stay fast.
SMALL = {"embedding_size": 32, "hidden_size": 32, "buckets": 4000, "wide_buckets": 4096}

needs_lite = pytest.mark.skipif(lite.lite_python() is None, reason="no lite venv (.venv-lite)")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A trained export of each model (its workdir), without the other targets."""
    mp = pytest.MonkeyPatch()
    mp.setattr(runner, "emit", lambda *a, **k: None)
    mp.setattr(runner, "_targets", lambda *a: {})
    workdirs = {}
    try:
        for name, (kind, preset) in MODELS.items():
            hp = recommended(kind, preset=preset)
            workdir, spec = make_workdir(
                tmp_path_factory.mktemp(name),
                kind,
                sizes=(120, 20, 40),
                learning_rate=hp.learning_rate,
                epochs=4,
            )
            spec.backend, spec.preset = "paddle", preset
            if name.startswith("fast"):
                spec.model_config = {
                    k: v for k, v in SMALL.items() if kind == "ner" or k != "hidden_size"
                }
            spec.save(workdir)
            runner.run(workdir)
            workdirs[name] = workdir
    finally:
        mp.undo()
    return workdirs


@needs_lite
@pytest.mark.parametrize("name", list(MODELS))
def test_the_lite_model_decides_as_the_export(trained, name, tmp_path):
    workdir = trained[name]
    kind, _preset = MODELS[name]
    export = workdir / "export"
    out = tmp_path / "lite"
    manifest = lite.make_lite(export, out)

    assert manifest["runtime"] == "paddle_lite" and manifest["target"] == "lite"
    assert manifest["model_file"] == "model.nb" and (out / "model.nb").stat().st_size > 0
    assert set(manifest["files"]) == {"model.nb", "model.arm.nb", "vocab.txt"} | (
        {"crf.json"} if name == "fast-tagger" else set()
    )
    assert read_manifest(out)["files"] == manifest["files"]  # every sha256 holds
    assert ("rows" in manifest) == (name == "fast-tagger")  # a GRU's rows go one at a time

    rows = load_split(workdir, "test", kind)
    served = Predictor.load(export).predict(rows)
    on_lite = Predictor.load(out).predict(rows, batch_size=8)
    assert [decision(p) for p in on_lite] == [decision(p) for p in served]
    assert any(decision(p) for p in served)  # it learned something to agree on


@needs_lite
def test_a_job_makes_every_target_and_checks_each_on_the_report_rows(
    trained, tmp_path, monkeypatch
):
    # As the runner does at a job's end (runtime.run._targets), for the targets the node makes.
    workdir = trained["fast-classifier"]
    rows = load_split(workdir, "test", "text_classification")
    preds = Predictor.load(workdir / "export").predict(rows)
    made = make_targets(workdir / "export", tmp_path / "targets", rows, preds)
    assert made["lite"]["status"] == "ready" and made["lite"]["runtime"] == "paddle_lite"
    assert made["lite"]["agreement"] == 1.0 and made["onnx"]["agreement"] == 1.0, made
    # A node that leaves lite out (PLATFORM_EXPORT_TARGETS) makes the others only.
    monkeypatch.setenv("PLATFORM_EXPORT_TARGETS", "onnx")
    assert set(make_targets(workdir / "export", tmp_path / "again", rows, preds)) == {"onnx"}


@needs_lite
def test_an_operator_lite_lacks_fails_the_target_with_its_name(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    # A legacy program (as Paddle 2.x exported) with an operator Paddle Lite has no kernel for;
    # from a file: to_static reads the network's source.
    script = tmp_path / "lacking.py"
    script.write_text(
        "import sys, paddle\n"
        "from paddle.static import InputSpec\n"
        "class Net(paddle.nn.Layer):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = paddle.nn.Embedding(8, 4)\n"
        "    def forward(self, input_ids):\n"
        "        return paddle.logcumsumexp(self.emb(input_ids), axis=1).sum(axis=1)\n"
        "spec = [InputSpec([None, None], 'int64', name='input_ids')]\n"
        "net = paddle.jit.to_static(Net(), input_spec=spec)\n"
        "paddle.jit.save(net, sys.argv[1])\n",
        "utf-8",
    )
    subprocess.run(
        [str(lite.lite_python()), "-I", str(script), str(export / "inference")],
        check=True,
        capture_output=True,
    )
    script.unlink()
    (export / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n", "utf-8")
    write_manifest(
        export,
        task_kind="text_classification",
        labels=["a", "b", "c", "d"],
        head="single",
        max_length=16,
        runtime="paddle_inference",
        model_file="inference.pdmodel",
        params_file="inference.pdiparams",
    )
    with pytest.raises(TargetError, match="logcumsumexp"):
        lite.make_lite(export, tmp_path / "lite")
    assert not (tmp_path / "lite").exists()


@needs_lite
def test_an_export_with_no_weights_to_rebuild_fails_saying_why(trained, tmp_path):
    # A PIR program converts only from the trained weights of a fast model.
    with pytest.raises(TargetError, match="rebuilds the fast models"):
        lite.make_lite(
            trained["fast-tagger"] / "export", tmp_path / "lite", tmp_path / "no-weights"
        )


def test_a_node_without_the_lite_venv_fails_the_target(tmp_path, monkeypatch):
    export = tmp_path / "export"
    export.mkdir()
    (export / "vocab.txt").write_text("[PAD]\n", "utf-8")
    write_manifest(export, runtime="paddle_inference", model_file="inference.json")
    monkeypatch.setenv("LITE_PYTHON", str(tmp_path / "no-python3.10"))
    with pytest.raises(TargetError, match=r"no Python 3\.10 on this node"):
        lite.make_lite(export, tmp_path / "lite")
    assert json.loads((export / "manifest.json").read_text("utf-8"))["runtime"]
