"""Export targets beyond the one training writes ("train once, deploy many"): each a folder of
its own with a manifest (sha256 of every file) that ``runtime.inference.Predictor`` loads, made
from the job's export and checked against it on the report's rows.

- ``onnx``: a Paddle Inference export through paddle2onnx, served by ONNX Runtime. A torch
  model's own export is already ONNX.
- ``lite``: a Paddle Inference export as Paddle Lite models for x86 and ARM devices
  (``runtime.lite``: made and run in a venv of its own, Python 3.10).

``PLATFORM_EXPORT_TARGETS`` (comma-separated, default every one) names the targets a node
makes: a site that never deploys to devices leaves ``lite`` out and saves its disk.

A target that cannot be made (an operator the converter lacks) fails alone, with the
converter's words; the export and the other targets stand.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from runtime.env import env_list
from runtime.inference import MANIFEST, PATH_FIELDS, Predictor, read_manifest, write_manifest

TARGETS_DIR = "targets"  # of the job's work directory, beside export/
ONNX = "onnx"
LITE = "lite"
ONNX_FILE = "model.onnx"
ONNX_OPSET = 13  # paddle2onnx's own choice for these models (GRU, int64 hashing)
# The runtime each target's manifest names, for the targets made from a Paddle export.
TARGET_RUNTIMES = {ONNX: "onnxruntime", LITE: "paddle_lite"}
CONVERT_TIMEOUT_S = 900

# Run apart: paddle2onnx aborts the whole process on some unsupported programs.
_PADDLE2ONNX = (
    "import sys, paddle2onnx; "
    "paddle2onnx.export(sys.argv[1], sys.argv[2], sys.argv[3], opset_version=int(sys.argv[4]))"
)


class TargetError(Exception):
    """A target that could not be made; its message says why (an operator's name, say)."""


def targets_for(manifest: dict) -> list[str]:
    """The targets made from an export with this manifest (those this node makes)."""
    if manifest.get("runtime") != "paddle_inference":
        return []
    wanted = env_list("PLATFORM_EXPORT_TARGETS", ",".join(TARGET_RUNTIMES))
    return [t for t in TARGET_RUNTIMES if t in wanted]


def make_target(export: Path, target: str, out: Path) -> dict:
    """Write ``target`` of the export in ``export`` into ``out`` (a new folder); its manifest."""
    if target == LITE:
        from runtime.lite import make_lite

        return make_lite(export, out)
    manifest = read_manifest(export)
    if target != ONNX or manifest.get("runtime") != "paddle_inference":
        raise TargetError(f"no {target} target for a {manifest.get('runtime')} export")
    out.mkdir(parents=True)
    try:
        _paddle_to_onnx(export, manifest, out / ONNX_FILE)
    except TargetError:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return finish_target(
        export, manifest, out, runtime=TARGET_RUNTIMES[target], model_file=ONNX_FILE, target=target
    )


def finish_target(export: Path, manifest: dict, out: Path, **fields) -> dict:
    """A target's folder completed: the export's vocabulary (and CRF transitions) carried into
    ``out`` beside the converted model, and its manifest written: the export's fields (labels,
    lengths, tokenizer…) but its files and runtime, with ``fields`` (runtime, model_file…)."""
    carried = [manifest["tokenizer"]["vocab"], manifest.get("crf_file")]
    for name in filter(None, carried):
        shutil.copy(export / name, out / name)
    dropped = {"format", "files", "runtime", *PATH_FIELDS} - {"crf_file"}
    kept = {k: v for k, v in manifest.items() if k not in dropped}
    return write_manifest(out, **{**kept, **fields})


def _paddle_to_onnx(export: Path, manifest: dict, onnx_file: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _PADDLE2ONNX,
            str(export / manifest["model_file"]),
            str(export / manifest["params_file"]),
            str(onnx_file),
            str(ONNX_OPSET),
        ],
        capture_output=True,
        text=True,
        timeout=CONVERT_TIMEOUT_S,
        check=False,
    )
    if proc.returncode or not onnx_file.is_file():
        said = [
            line.strip()
            for line in (proc.stdout + proc.stderr).splitlines()
            if "not supported" in line or "Error" in line or "error" in line
        ]
        raise TargetError(
            "paddle2onnx could not convert the model: "
            + ("; ".join(said[-3:]) if said else f"exit status {proc.returncode}")
        )
    _wire_sequence_lengths(onnx_file)


def _wire_sequence_lengths(onnx_file: Path) -> None:
    """paddle2onnx leaves a recurrent layer's ``sequence_lens`` empty (a padded row is then
    read to its end): give it each row's length, its ids that are not [PAD] (0)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(onnx_file))
    graph = model.graph
    recurrent = [
        n
        for n in graph.node
        if n.op_type in ("GRU", "LSTM", "RNN") and (len(n.input) < 5 or not n.input[4])
    ]
    if not recurrent:
        return
    graph.initializer.extend(
        [
            helper.make_tensor("pad_id", TensorProto.INT64, [], [0]),
            helper.make_tensor("time_axis", TensorProto.INT64, [1], [1]),
        ]
    )
    lengths = [
        helper.make_node("Equal", ["input_ids", "pad_id"], ["is_pad"]),
        helper.make_node("Not", ["is_pad"], ["is_real"]),
        helper.make_node("Cast", ["is_real"], ["real_i32"], to=TensorProto.INT32),
        helper.make_node("ReduceSum", ["real_i32", "time_axis"], ["sequence_lens"], keepdims=0),
    ]
    for i, node in enumerate(lengths):
        graph.node.insert(i, node)
    for node in recurrent:
        while len(node.input) < 5:
            node.input.append("")
        node.input[4] = "sequence_lens"
    onnx.checker.check_model(model)
    onnx.save(model, str(onnx_file))


def decision(pred: dict):
    """What a prediction decides (its label, labels or entity spans), scores aside."""
    if "entities" in pred:
        return [(e["start"], e["end"], e["label"]) for e in pred["entities"]]
    return pred.get("label") or sorted(pred.get("labels") or [])


def make_targets(export: Path, out_root: Path, rows: list, preds: list) -> dict[str, dict]:
    """Every target of the export under ``out_root/<target>``, each checked on ``rows``
    against ``preds`` (the export's own predictions): {target: its status and figures}."""
    results: dict[str, dict] = {}
    for target in targets_for(read_manifest(export)):
        out = out_root / target
        shutil.rmtree(out, ignore_errors=True)
        try:
            manifest = make_target(export, target, out)
        except TargetError as exc:
            results[target] = {"status": "failed", "error": str(exc)}
            continue
        served = Predictor.load(out).predict(rows) if rows else []
        same = sum(decision(a) == decision(b) for a, b in zip(served, preds, strict=True))
        results[target] = {
            "status": "ready",
            "runtime": manifest["runtime"],
            "agreement": round(same / len(rows), 6) if rows else None,
            "size": sum(p.stat().st_size for p in out.rglob("*") if p.name != MANIFEST),
        }
    return results
