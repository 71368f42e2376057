"""The ``lite`` target: a Paddle Inference export as a Paddle Lite model (``model.nb``) for ARM
and x86 devices, made and run by a venv of its own (paddlelite's wheels stop at Python 3.10:
``.venv-lite``, or the Python that ``LITE_PYTHON`` names) through ``runtime/lite_convert.py``.

Paddle Lite's ``opt`` reads only legacy programs (``.pdmodel``), and Paddle 3 writes only PIR
ones (its legacy IR no longer traces these models). A legacy export converts as it is; a PIR
export of a fast model (``runtime.backends.paddle_models``) is rebuilt from the job's trained
weights (``best/`` beside ``export/``) by Paddle 2.6 in the lite venv, then converted; so is
a PaddleNLP ERNIE classifier or tagger (``lite_convert``'s ``Ernie``). A BiGRU's program
reads no sequence lengths: its rows are run one at a time without their padding (``rows`` in
the manifest). ``model.nb`` is for x86 (the
one the agreement check runs here), ``model.arm.nb`` for ARM devices.

What ``opt`` cannot convert (an operator Paddle Lite lacks) fails the target with the
operator's name (``TargetError``).
"""

import io
import json
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path

import numpy as np

from runtime.env import env_str
from runtime.inference import read_manifest
from runtime.lite_convert import architecture_of
from runtime.targets import TargetError, finish_target  # which imports this module lazily

LITE = "lite"
RUNTIME = "paddle_lite"
NB_FILE = "model.nb"  # x86: what the predictor here runs and the agreement check proves
ARM_NB_FILE = "model.arm.nb"  # ARM devices (Paddle Lite picks each place's kernels at opt)
PLACES = {"x86": NB_FILE, "arm": ARM_NB_FILE}
CONVERT_TIMEOUT_S = 900
# Run isolated (``-I``): no PYTHONPATH of the 3.11 venvs reaches the 3.10 one.
SCRIPT = Path(__file__).with_name("lite_convert.py")
ROOT = Path(__file__).resolve().parents[1]
# The architectures the lite venv rebuilds (lite_convert._networks), and those among them
# whose rows are served one at a time, unpadded (a recurrent layer).
REBUILT = (
    "ngram_bag",
    "bigru_crf",
    "ErnieForSequenceClassification",
    "ErnieForTokenClassification",
)
UNPADDED = ("bigru_crf",)
NO_LITE = "no Python 3.10 on this node (no lite venv: .venv-lite, or LITE_PYTHON)"


def lite_python() -> Path | None:
    """The lite venv's interpreter, when this node has one."""
    path = Path(env_str("LITE_PYTHON", str(ROOT / ".venv-lite" / "bin" / "python")))
    return path if path.is_file() else None


def _run_lite(args: list[str], what: str, place: str = "") -> str:
    python = lite_python()
    if python is None:
        raise TargetError(NO_LITE)
    try:
        proc = subprocess.run(
            [str(python), "-I", str(SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=CONVERT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise TargetError(f"{what} took more than {CONVERT_TIMEOUT_S} s") from exc
    said = proc.stdout + proc.stderr
    if proc.returncode:
        ops = unsupported_ops(said)
        if ops:
            raise TargetError(
                f"Paddle Lite{f' ({place})' if place else ''} lacks the operator(s) "
                f"{', '.join(ops)}: {what} failed"
            )
        lines = [
            line.strip()
            for line in said.splitlines()
            if re.search(r"error|failed|lacks|no lite network", line, re.IGNORECASE)
        ]
        raise TargetError(
            f"{what} failed: " + ("; ".join(lines[-3:]) or f"exit status {proc.returncode}")
        )
    return said


def unsupported_ops(said: str) -> list[str]:
    """The operators ``opt`` names when it refuses a model, in its words "These unsupported
    ops are: 'a', 'b'" (or "op 'a' is not supported")."""
    found: list[str] = []
    for line in said.splitlines():
        if re.search(r"unsupported op|not supported|no kernel|doesn't support", line, re.I):
            for op in re.findall(r"'([A-Za-z0-9_]+)'", line):
                if op not in found and op not in (*PLACES, "host"):
                    found.append(op)
    return found


def _legacy_program(
    export: Path, manifest: dict, checkpoint: Path | None, tmp: Path
) -> tuple[Path, Path, str | None]:
    """The export's program and parameters as a legacy program; with the architecture of the
    trained weights, when they are at hand."""
    checkpoint = checkpoint or export.parent / "best"
    config = checkpoint / "config.json"
    architecture = (
        architecture_of(json.loads(config.read_text("utf-8"))) if config.is_file() else None
    )
    model_file = export / manifest["model_file"]
    if model_file.suffix == ".pdmodel":  # a legacy export (Paddle 2): as it is
        return model_file, export / manifest["params_file"], architecture
    if architecture not in REBUILT:
        raise TargetError(
            "Paddle Lite reads no PIR program and Paddle 3 writes no other: the lite target "
            f"rebuilds the fast models and ERNIE ({', '.join(REBUILT)}) from their trained "
            "weights, "
            + (f"not a {architecture} model" if architecture else f"which {checkpoint} lacks")
        )
    stem = tmp / "inference"
    _run_lite(["legacy", str(checkpoint), str(stem)], "the legacy program (Paddle 2.6)")
    return stem.with_suffix(".pdmodel"), stem.with_suffix(".pdiparams"), architecture


def make_lite(export: Path, out: Path, checkpoint: Path | None = None) -> dict:
    """Write the lite target of the export in ``export`` into ``out`` (a new folder): its
    manifest. ``checkpoint``: the trained weights of a PIR export (``best/`` beside it)."""
    manifest = read_manifest(export)
    if manifest.get("runtime") != "paddle_inference":
        raise TargetError(f"no {LITE} target for a {manifest.get('runtime')} export")
    if lite_python() is None:
        raise TargetError(NO_LITE)
    out.mkdir(parents=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model_file, params_file, architecture = _legacy_program(
                export, manifest, checkpoint, Path(tmp)
            )
            for place, nb_file in PLACES.items():
                stem = out / nb_file.removesuffix(".nb")
                args = ["convert", str(model_file), str(params_file), str(stem), place]
                _run_lite(args, f"opt (Paddle Lite, {place})", place)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    rows = {"rows": "one_unpadded"} if architecture in UNPADDED else {}
    return finish_target(
        export,
        manifest,
        out,
        **rows,
        runtime=RUNTIME,
        model_file=NB_FILE,
        arm_model_file=ARM_NB_FILE,
        target=LITE,
    )


def _send(stream, payload: bytes) -> None:
    stream.write(struct.pack("<Q", len(payload)) + payload)
    stream.flush()


def _receive(stream) -> bytes | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    return stream.read(struct.unpack("<Q", head)[0])


def paddle_lite_process(model_nb: Path):
    """A call of the ``.nb`` model (``{input name: array}`` → logits) served by Paddle Lite's
    runtime in a process of the lite venv (``lite_convert serve``), which lives as long as the
    returned function (``runtime.inference`` runs it)."""
    python = lite_python()
    if python is None:
        raise RuntimeError(NO_LITE)
    errors = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [str(python), "-I", str(SCRIPT), "serve", str(model_nb)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
    )
    lock = threading.Lock()  # one request at a time on the pipe

    def call(feed: dict[str, np.ndarray]) -> np.ndarray:
        request = io.BytesIO()
        inputs = {k: feed[k] for k in ("input_ids", "token_type_ids") if k in feed}
        np.savez(request, **inputs)  # type: ignore[arg-type]  # numpy's stub: arrays by name
        try:
            with lock:
                _send(proc.stdin, request.getvalue())
                answer = _receive(proc.stdout)
        except BrokenPipeError:
            answer = None
        if answer is None:
            errors.seek(0)
            tail = errors.read().decode("utf-8", "replace").strip().splitlines()[-3:]
            raise RuntimeError("the Paddle Lite predictor stopped: " + " ".join(tail))
        return np.load(io.BytesIO(answer))["logits"]

    def stop(proc=proc, errors=errors) -> None:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        errors.close()

    weakref.finalize(call, stop)
    return call
