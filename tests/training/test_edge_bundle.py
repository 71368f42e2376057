"""An edge bundle runs where the platform is not: a model trained by the real runner, its
ONNX target bundled (training.edge), unpacked into an empty folder, installed into a clean venv
with nothing but what its requirements.txt names (ONNX Runtime, numpy), and run: it gives the
report's predictions for the examples, and its README says how."""

import io
import json
import subprocess
import sys
import tarfile
import uuid

import pytest

from runtime.inference import read_manifest
from training import storage
from training.edge import edge_bundle
from training.models import ModelVersion
from training.registry import model_version_targets

pytestmark = pytest.mark.django_db


def test_an_edge_bundle_reproduces_the_reports_predictions_in_a_clean_venv(
    team, owner, exports, tmp_path
):
    trained = exports("ner").parent  # a Paddle model with its ONNX target, as a job leaves it
    evaluation = json.loads((trained / "evaluation.json").read_text("utf-8"))
    assert evaluation["targets"]["onnx"]["status"] == "ready"
    staged = tmp_path / "staged"
    (staged / "targets").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(trained / "export"), str(staged / "export")], check=True)
    subprocess.run(
        ["cp", "-r", str(trained / "targets" / "onnx"), str(staged / "targets")], check=True
    )
    prefix = f"models/{uuid.uuid4().hex}/"
    manifest = read_manifest(staged / "export")
    version = ModelVersion.objects.create(
        team=team,
        name="新闻",
        number=1,
        task_kind="ner",
        labels=manifest["labels"],
        backend="paddle",
        runtime=manifest["runtime"],
        manifest=manifest,
        evaluation=evaluation,
        storage_prefix=prefix,
        files=storage.store_dir(staged, prefix),
        created_by=owner,
    )
    assert [t["name"] for t in model_version_targets(version)] == ["paddle_inference", "onnx"]

    out = io.BytesIO()
    assert edge_bundle(version, "onnx", out)
    assert not edge_bundle(version, "paddle_lite", io.BytesIO())
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tf:
        tf.extractall(tmp_path / "edge", filter="data")
    bundle = tmp_path / "edge" / "onnx-edge"
    assert "predict.py --check" in (bundle / "README.md").read_text("utf-8")
    requirements = (bundle / "requirements.txt").read_text("utf-8").split()
    assert requirements == ["numpy==1.26.4", "onnxruntime==1.32.0"]

    # A clean venv: nothing but the bundle's requirements (no platform, no Django, no Paddle).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "-r", str(bundle / "requirements.txt")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    python = str(venv / "bin" / "python")
    # Run from another folder, it finds its own files.
    checked = subprocess.run(
        [python, str(bundle / "predict.py"), "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    examples = len(evaluation["examples"])
    assert f"{examples} of {examples} examples as expected" in checked.stdout
    # On its own inputs it gives the report's outputs, spans and all.
    ran = subprocess.run(
        [python, str(bundle / "predict.py"), str(bundle / "examples.jsonl")],
        capture_output=True,
        text=True,
        check=True,
    )
    outputs = [json.loads(line) for line in ran.stdout.splitlines()]
    expected = [e["output"] for e in evaluation["examples"]]
    assert [o["entities"] for o in outputs] == [
        [{**e, "score": pytest.approx(e["score"], abs=1e-4)} for e in x["entities"]]
        for x in expected
    ]
    frozen = subprocess.run(
        [str(venv / "bin" / "pip"), "freeze"], capture_output=True, text=True, check=True
    ).stdout.lower()
    assert "paddle" not in frozen and "django" not in frozen
