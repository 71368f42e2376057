"""On a machine with a CUDA card (skipped elsewhere, CI included): the probe finds the card, and
the torch backend trains on it, in float32 and in mixed precision (bfloat16 without a loss
scaler, float16 with one), to the quality it reaches on the CPU, and exports an ONNX model that
answers as the trained one does."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine", allow_module_level=True)

import runtime.run as runner  # noqa: E402
from runtime.backends.torch import TorchOps  # noqa: E402
from tests.helpers.workdir import make_workdir  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_probe_finds_the_cards():
    out = subprocess.run(
        [sys.executable, str(ROOT / "platform/hardware/probe.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    devices = json.loads(out)["torch"]["devices"]
    assert len(devices) == torch.cuda.device_count() >= 1
    assert all(d["detect"] == "cuda" and d["memory"] > 2**30 for d in devices)
    assert devices[0]["name"] == torch.cuda.get_device_name(0)


@pytest.mark.parametrize(
    ("amp", "dtype"), [(False, "bfloat16"), (True, "bfloat16"), (True, "float16")]
)
def test_the_torch_backend_trains_on_the_card(tmp_path, monkeypatch, amp, dtype):
    seen: list = []
    monkeypatch.setattr(runner, "emit", lambda kind, **d: seen.append((kind, d)))
    built: list[TorchOps] = []
    build = TorchOps.build

    def spy(self, *args, **kwargs):
        build(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(TorchOps, "build", spy)
    workdir, spec = make_workdir(tmp_path, "text_classification", amp=amp, amp_dtype=dtype)
    spec.device_type, spec.device = "gpu", "gpu"
    spec.save(workdir)

    evaluation = runner.run(workdir)
    ops = built[0]
    assert ops.device.type == "cuda"
    assert next(ops.model.parameters()).device.type == "cuda"
    assert ops.amp is amp
    assert (ops.scaler is not None) is (amp and dtype == "float16")
    losses = [d["loss"] for kind, d in seen if kind == "loss"]
    assert losses and losses[-1] < losses[0]
    assert evaluation["metrics"]["micro_f1"] >= 0.9, evaluation["metrics"]
    assert (workdir / "export" / "model.onnx").stat().st_size > 0
