"""Compression of a trained model version (a job of objective "int8"): INT8 post-training
quantization of its ONNX form with ONNX Runtime, evaluated on the test split beside the model
it came from (its parent), with both measured on this node.

The parent's files are in ``parent/`` of the work directory (its export, and ``targets/onnx``
for a Paddle model: runtime.targets). The result is an export like any other (``export/``,
served by ONNX Runtime) and a report whose ``compression`` holds the method and its
parameters, per-label deltas, file sizes and latency at batch 1 and throughput at batch 32.

- ``dynamic`` (the default): weights to INT8 ahead of time, activations scaled per batch at
  run time. Needs no data; right for the embedding-heavy fast models.
- ``static``: activations' ranges calibrated on ``calibration_rows`` rows of the dev split
  (the feeds the parent's own predictor builds for them). Faster where it holds, but a model
  that masks with large constants (the fast classifiers) loses its ranges: the report's
  deltas say so.
"""

import json
import shutil
import time
from pathlib import Path

import numpy as np

from runtime.inference import MANIFEST, Predictor, read_manifest, write_manifest
from runtime.targets import ONNX, TARGETS_DIR, decision

OBJECTIVE = "int8"
MODES = ("dynamic", "static")
PARENT_DIR = "parent"
QUANT_FILE = "model.int8.onnx"
# What dynamic quantization quantizes: matrix products, embedding lookups, recurrent layers.
DYNAMIC_OPS = ["MatMul", "Gemm", "Gather", "Attention", "LSTM", "GRU"]
LATENCY_ROWS = 64  # rows timed at batch 1 (and as many batches of 32), per model


def onnx_form(parent: Path) -> Path:
    """The parent's ONNX export: its own, or the target made from its Paddle export."""
    export = parent / "export"
    if read_manifest(export).get("runtime") == "onnxruntime":
        return export
    target = parent / TARGETS_DIR / ONNX
    if (target / MANIFEST).is_file():
        return target
    raise ValueError("the model has no ONNX form to quantize (its ONNX target failed)")


def quantize(source: Path, out: Path, mode: str, calibration: list[dict[str, np.ndarray]]):
    """``source``'s ONNX model quantized to INT8 into ``out`` (a new folder), with the same
    vocabulary and manifest fields; its manifest."""
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    manifest = read_manifest(source)
    out.mkdir(parents=True)
    model = source / manifest["model_file"]
    prepared = out / "prepared.onnx"
    # Shape inference and graph clean-up first, as ONNX Runtime's guide asks.
    quant_pre_process(str(model), str(prepared), skip_symbolic_shape=True)
    if mode == "dynamic":
        # Signed weights with unsigned activations: the VNNI/AMX path of x86 (2.4× FP32 for
        # ERNIE here; u8 weights gained nothing). Convolutions stay FP32: ONNX Runtime's
        # ConvInteger is slower than its float Conv.
        quantize_dynamic(
            str(prepared),
            str(out / QUANT_FILE),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=DYNAMIC_OPS,
        )
    else:
        import onnx
        from onnxruntime.quantization import QuantFormat, quantize_static

        graph = onnx.load(str(prepared), load_external_data=False).graph
        weights = {w.name for w in graph.initializer}
        names = [i.name for i in graph.input if i.name not in weights]
        quantize_static(
            str(prepared),
            str(out / QUANT_FILE),
            _Feeds([{n: feed[n] for n in names} for feed in calibration]),
            quant_format=QuantFormat.QOperator,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QUInt8,
        )
    prepared.unlink()
    for name in filter(None, [manifest["tokenizer"]["vocab"], manifest.get("crf_file")]):
        shutil.copy(source / name, out / name)
    fields = {k: v for k, v in manifest.items() if k not in ("format", "files", "model_file")}
    fields.pop("target", None)
    return write_manifest(out, **fields, model_file=QUANT_FILE, quantization=f"int8-{mode}")


class _Feeds:
    """ONNX Runtime's CalibrationDataReader over recorded feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def recorded_feeds(export: Path, rows: list[dict], batch_size: int = 8) -> list[dict]:
    """The model inputs the export's predictor builds for ``rows`` (windows, pairs and all):
    static quantization's calibration data, encoded as serving encodes."""
    predictor = Predictor.load(export)
    feeds: list[dict] = []
    run = predictor._run

    def record(feed: dict[str, np.ndarray]) -> np.ndarray:
        feeds.append({k: np.array(v) for k, v in feed.items()})
        return run(feed)

    predictor._run = record
    predictor.predict(rows, batch_size=batch_size)
    return feeds


def latency(export: Path, rows: list[dict]) -> dict:
    """ms per row at batch 1 and rows per second at batch 32, on this node (one thread, as
    the serving host's replicas run), after a warm-up."""
    predictor = Predictor.load(export)
    rows = rows[:LATENCY_ROWS] or [{"text": "样例"}]
    predictor.predict(rows[:4], batch_size=1)
    started = time.perf_counter()
    predictor.predict(rows, batch_size=1)
    b1 = (time.perf_counter() - started) / len(rows)
    batch = (rows * (32 * 4 // len(rows) + 1))[: 32 * 4]
    started = time.perf_counter()
    predictor.predict(batch, batch_size=32)
    b32 = len(batch) / (time.perf_counter() - started)
    return {"b1_ms": round(b1 * 1000, 3), "b32_rows_per_s": round(b32, 1)}


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _per_label(child: dict, parent: dict) -> dict[str, float]:
    """F1 of each label, the compressed model's less its parent's."""
    ours, theirs = child.get("per_label") or {}, parent.get("per_label") or {}
    return {
        label: round(ours[label]["f1"] - theirs[label]["f1"], 6)
        for label in ours
        if label in theirs and "f1" in ours[label] and "f1" in theirs[label]
    }


def compared(spec, workdir: Path, scored: tuple, export: Path, parent_onnx: Path | None) -> dict:
    """A model made from the parent in ``parent/`` (compressed, distilled) beside it on the
    same rows: ``scored`` is the model's (rows, predictions, metrics) from its ``export``.
    The share of rows decided alike, the parent's metrics and the deltas (per label too),
    and the size and speed of the model, the parent as served and (``parent_onnx``) its FP32
    ONNX form."""
    from runtime.run import evaluate_export

    rows, preds, metrics = scored
    parent = workdir / PARENT_DIR / "export"
    parent_eval, _rows, parent_preds = evaluate_export(spec, workdir, parent)
    agree = sum(decision(a) == decision(b) for a, b in zip(preds, parent_preds, strict=True))
    before = parent_eval["metrics"]
    models = {
        "model": export,
        "parent": parent,
        **({"parent_onnx": parent_onnx} if parent_onnx else {}),
    }
    return {
        "agreement": round(agree / len(rows), 6) if rows else None,
        "parent_metrics": {k: v for k, v in before.items() if isinstance(v, int | float)},
        "metric_delta": {
            k: round(metrics[k] - v, 6)
            for k, v in before.items()
            if isinstance(v, int | float) and isinstance(metrics.get(k), int | float)
        },
        "per_label_f1_delta": _per_label(metrics, before),
        "size": {name: _size(path) for name, path in models.items()},
        "latency": {name: latency(path, rows) for name, path in models.items()},
    }


def run_compression(spec, workdir: Path, emit) -> dict:
    """The job: quantize, export, evaluate beside the parent, write evaluation.json."""
    from runtime.loop import load_split
    from runtime.run import evaluate_export

    hp = spec.hp
    mode = hp.quantization
    if mode not in MODES:
        raise ValueError(f"unknown quantization {mode!r}: {', '.join(MODES)}")
    parent = workdir / PARENT_DIR
    source = onnx_form(parent)
    emit("state", phase="compressing")
    calibration: list[dict] = []
    if mode == "static":
        rows = load_split(workdir, "dev", spec.task_kind)[: hp.calibration_rows]
        if not rows:
            raise ValueError("static quantization calibrates on the dev split, which is empty")
        calibration = recorded_feeds(source, rows)
        emit("log", message=f"calibrating on {len(rows)} dev rows ({len(calibration)} batches)")
    export = workdir / "export"
    shutil.rmtree(export, ignore_errors=True)
    quantize(source, export, mode, calibration)
    # The checkpoint a version keeps: the vocabulary (there are no trainable weights).
    best = workdir / "best"
    best.mkdir(exist_ok=True)
    shutil.copy(export / read_manifest(export)["tokenizer"]["vocab"], best / "vocab.txt")

    emit("state", phase="evaluating")
    evaluation, rows, preds = evaluate_export(spec, workdir, export)
    evaluation["compression"] = {
        "method": OBJECTIVE,
        "params": {
            "mode": mode,
            **({"calibration_rows": hp.calibration_rows} if calibration else {}),
        },
        **compared(spec, workdir, (rows, preds, evaluation["metrics"]), export, source),
    }
    (workdir / "evaluation.json").write_text(
        json.dumps(evaluation, ensure_ascii=False, indent=1), encoding="utf-8"
    )
    summary = {k: v for k, v in evaluation["metrics"].items() if isinstance(v, int | float)}
    emit("metrics", step=0, split=evaluation["split"], metrics=summary)
    return evaluation
