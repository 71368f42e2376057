"""Edge bundles: one export target of a model version, ready to run where the platform is not.
A ``.tar.gz`` of the target's files (``model/``, its manifest with every file's sha256, the
vocabulary and label set), a standalone predictor (``predict.py``) with the platform's own
prediction code beside it (``runtime/``: tokenising, windows, decoding; numpy only, no Django),
the runtime it needs pinned in ``requirements.txt``, example inputs with the outputs the
evaluated export gave for them, and a README."""

import io
import json
import tarfile
from pathlib import Path

import runtime.inference
from training.models import ModelVersion
from training.registry import model_version_target_files, model_version_targets

RUNTIME_DIR = Path(runtime.inference.__file__).parent
# The platform's prediction code, which imports nothing else of it (numpy only).
RUNTIME_MODULES = ("__init__.py", "kinds.py", "tokenizer.py", "data.py", "inference.py")
PREDICT = RUNTIME_DIR / "edge" / "predict.py"
REQUIREMENTS = Path(__file__).resolve().parent.parent / "platform/requirements"
# What each runtime needs installed, pinned as the platform's venv that runs it has it, and
# the Pythons it runs on (paddlelite's wheels stop at 3.10; the bundled code runs on 3.10+).
NEEDS = {
    "onnxruntime": ("numpy", "onnxruntime"),
    "paddle_inference": ("numpy", "paddlepaddle"),
    "paddle_lite": ("numpy", "paddlelite"),
}
PINNED_IN = {"paddle_lite": REQUIREMENTS / "lite.txt"}
PYTHONS = {"paddle_lite": "Python 3.10, where paddlelite's wheels stop"}
NOTES = {
    "paddle_lite": "- `model/model.nb` is for x86 machines, `model/model.arm.nb` for ARM "
    "devices:\n  the predictor picks the one for the machine it runs on.\n"
}

README = """# {name} · {target} edge bundle

The model version {name} ({task_kind}; labels: {labels}) as its {target} target, with a
predictor that needs only {runtime} and numpy ({python}): no platform, no Django.

    python -m venv venv && venv/bin/pip install -r requirements.txt
    venv/bin/python predict.py --check              # the examples give the expected outputs
    venv/bin/python predict.py inputs.jsonl         # one JSON input a line; or from stdin

An input is a text (a JSON string), {{"text": "…"}}, or for a text pair
{{"text_a": "…", "text_b": "…"}}. Each output line is what the platform's endpoint answers:
{output}.

- `model/`: the model, its vocabulary and `manifest.json` (the sha256 of every file; the
  predictor refuses a file that does not match).
- `runtime/`: the platform's own tokenising, windowing and decoding code, so that long texts,
  pairs and entity spans come out exactly as on the platform.
- `examples.jsonl`, `expected.jsonl`: test inputs and the outputs the evaluated model gave.
{notes}"""

OUTPUTS = {
    "text_classification": '{"label", "score", "scores"}',
    "text_pair": '{"label", "score", "scores"}',
    "multi_label": '{"labels", "scores"}',
    "ner": '{"entities": [{"start", "end", "label", "text", "score"}]}',
}


def _pins(runtime_name: str) -> list[str]:
    """``name==version`` of each package ``runtime_name`` needs, as the platform pins it."""
    pins = {}
    pinned_in = PINNED_IN.get(runtime_name, REQUIREMENTS / "runtime.txt")
    for line in pinned_in.read_text("utf-8").splitlines():
        name, _, version = line.partition("==")
        if version and not line.startswith("#"):
            pins[name.strip().lower()] = f"{name.strip()}=={version.strip()}"
    return [pins.get(name, name) for name in NEEDS[runtime_name]]


def _add_bytes(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def edge_bundle(version: ModelVersion, target: str, out) -> bool:
    """Write the edge bundle of ``target`` of ``version`` as one .tar.gz to ``out``; False
    if the version has no such target ready."""
    found = {t["name"]: t for t in model_version_targets(version)}
    if target not in found or found[target]["status"] != "ready":
        return False
    runtime_name = str(found[target]["runtime"])
    if runtime_name not in NEEDS:
        return False
    top = f"{target}-edge/"
    examples = [e for e in (version.evaluation or {}).get("examples") or [] if isinstance(e, dict)]
    with tarfile.open(fileobj=out, mode="w:gz") as tf:
        for rel, opened, size in model_version_target_files(version, target):
            info = tarfile.TarInfo(top + "model/" + rel)
            info.size = size
            with opened() as f:
                tf.addfile(info, f)
        for module in RUNTIME_MODULES:
            tf.add(RUNTIME_DIR / module, top + "runtime/" + module)
        tf.add(PREDICT, top + "predict.py")
        lines = {
            "examples.jsonl": [e.get("input") for e in examples],
            "expected.jsonl": [e.get("output") for e in examples],
        }
        for name, values in lines.items():
            text = "".join(json.dumps(v, ensure_ascii=False) + "\n" for v in values)
            _add_bytes(tf, top + name, text.encode())
        requirements = "\n".join(_pins(runtime_name)) + "\n"
        _add_bytes(tf, top + "requirements.txt", requirements.encode())
        readme = README.format(
            name=str(version),
            target=target,
            task_kind=version.task_kind,
            labels=", ".join(version.labels),
            runtime=runtime_name,
            python=PYTHONS.get(runtime_name, "Python 3.11, as the platform runs it"),
            notes=NOTES.get(runtime_name, ""),
            output=OUTPUTS.get(version.task_kind, "a JSON object"),
        )
        _add_bytes(tf, top + "README.md", readme.encode())
    return True
