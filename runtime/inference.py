"""An exported model and its manifest, and the predictor that serves it (evaluation here, the
serving host later): the same tokenizer and decoding as training, on a runtime found by the
manifest's ``runtime``.

``manifest.json`` names the task kind, labels, tokenizer, maximum length, runtime, the model's
input names and the sha256 of every file; loading refuses a file whose hash differs.
"""

import hashlib
import json
import platform
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import numpy as np

from runtime.data import LabelSpace, predict
from runtime.tokenizer import CharTokenizer

MANIFEST = "manifest.json"
VOCAB = "vocab.txt"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(out_dir: Path, **fields) -> dict:
    """Write ``manifest.json`` for every file of ``out_dir`` (their sha256) plus ``fields``."""
    files = {
        p.relative_to(out_dir).as_posix(): sha256_file(p)
        for p in sorted(out_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {"format": 1, "tokenizer": {"type": "char", "vocab": VOCAB}, **fields}
    manifest["files"] = files
    (out_dir / MANIFEST).write_text(json.dumps(manifest, ensure_ascii=False, indent=2), "utf-8")
    return manifest


# Manifest fields that name a file or folder of the export.
PATH_FIELDS = (
    "model_file",
    "params_file",
    "config_file",
    "adapter_dir",
    "crf_file",
    "arm_model_file",
)


def check_manifest_paths(manifest: dict) -> None:
    """Refuse a manifest (one imported from another site, say) that names a path outside its
    export: absolute, with ``..``, or not a plain relative name."""
    names = list(manifest.get("files") or {})
    names += [manifest[k] for k in PATH_FIELDS if manifest.get(k)]
    tokenizer = manifest.get("tokenizer") or {}
    names += [tokenizer[k] for k in ("vocab", "file") if tokenizer.get(k)]
    for name in names:
        path = PurePosixPath(name) if isinstance(name, str) else None
        if (
            path is None
            or not path.parts
            or path.is_absolute()
            or ".." in path.parts
            or "\\" in name
            or ":" in path.parts[0]
        ):
            raise ValueError(f"the manifest names a path outside the model: {name!r}")


def read_manifest(export_dir: Path, verify: bool = True) -> dict:
    path = export_dir / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: not an exported model")
    manifest = json.loads(path.read_text("utf-8"))
    check_manifest_paths(manifest)
    if verify:
        for name, digest in manifest["files"].items():
            f = export_dir / name
            if not f.is_file():
                raise FileNotFoundError(f"the exported model lacks {name}")
            if sha256_file(f) != digest:
                raise ValueError(f"{name} does not match its sha256 in the manifest")
    return manifest


# A runtime: (export_dir, manifest, device) → run(feed: {input name: array}) → logits.
Runtime = Callable[[Path, dict, str], Callable[[dict[str, np.ndarray]], np.ndarray]]


def flush_denormals() -> bool:
    """Have this process's CPU take denormal floats as zero (FTZ and DAZ), as PyTorch's
    ``set_flush_denormal`` does. Adam with L2 decay drives the weights that no batch moves any
    more (a dead convolution channel, a rare character's row) towards zero through the denormal
    range, where each multiplication costs a hundred times more: on real reviews a fast
    model's convolution weights were 92 % denormal after four epochs, and a convolution over
    them 50 times slower. Paddle has the switch (``platform::ScopedFlushDenormal``) but no
    Python API: its constructor sets the calling thread's flags, which threads started later
    inherit. Training jobs and the predictors of Paddle Inference call it (a model trained
    before holds its denormal weights). False where the build lacks it (the flags are x86's;
    other CPUs keep theirs)."""
    import ctypes

    import paddle

    try:
        library = ctypes.CDLL(str(Path(paddle.__file__).parent / "base" / "libpaddle.so"))
        scope = library["_ZN6paddle8platform19ScopedFlushDenormalC1Ev"]
    except (OSError, AttributeError):
        return False
    scope(ctypes.create_string_buffer(64))  # the scope object, never destroyed: the flags stay
    return True


def _paddle_inference(export_dir: Path, manifest: dict, device: str):
    import paddle.inference as pi

    flush_denormals()  # the predictor runs in this thread
    config = pi.Config(
        str(export_dir / manifest["model_file"]), str(export_dir / manifest["params_file"])
    )
    if device.startswith("gpu"):
        config.enable_use_gpu(256, int(device.partition(":")[2] or 0))
    else:
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(1)
    config.disable_glog_info()
    predictor = pi.create_predictor(config)
    names = predictor.get_input_names()
    output = predictor.get_output_handle(predictor.get_output_names()[0])

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        for name in names:
            predictor.get_input_handle(name).copy_from_cpu(feed[name])
        predictor.run()
        return output.copy_to_cpu()

    return run


def _onnxruntime(export_dir: Path, manifest: dict, device: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.set_denormal_as_zero", "1")  # flush_denormals
    providers = ["CUDAExecutionProvider"] if device.startswith("gpu") else []
    session = ort.InferenceSession(
        str(export_dir / manifest["model_file"]),
        options,
        providers=[*providers, "CPUExecutionProvider"],
    )
    names = [i.name for i in session.get_inputs()]

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        return session.run(None, {name: feed[name] for name in names})[0]

    return run


def _paddle_lite(export_dir: Path, manifest: dict, device: str):
    """Paddle Lite's runtime: in this process where ``paddlelite`` is installed (an edge
    bundle's venv, Python 3.10), else in a process of the platform's lite venv. ``model.nb``
    is the x86 model; an ARM machine runs ``arm_model_file``."""
    arm = platform.machine().lower() in ("aarch64", "arm64") and "arm_model_file" in manifest
    model_nb = export_dir / manifest["arm_model_file" if arm else "model_file"]
    try:
        from paddlelite.lite import MobileConfig, create_paddle_predictor
    except ImportError:
        from runtime.lite import paddle_lite_process

        call = paddle_lite_process(model_nb)
    else:
        config = MobileConfig()
        config.set_model_from_file(str(model_nb))
        predictor = create_paddle_predictor(config)
        names = predictor.get_input_names()

        def call(feed: dict[str, np.ndarray]) -> np.ndarray:
            for i, name in enumerate(names):
                tensor = np.ascontiguousarray(feed[name], dtype="int64")
                predictor.get_input(i).from_numpy(tensor)
            predictor.run()
            return predictor.get_output(0).numpy()

    if manifest.get("rows") != "one_unpadded":
        return call
    return _one_row_at_a_time(call)


def _one_row_at_a_time(call):
    """A program that reads no sequence lengths (a BiGRU for Paddle Lite): each row alone, cut
    after its last id that is not [PAD] (0); its padding scores 0."""

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        ids = feed["input_ids"]
        rows = []
        for i in range(len(ids)):
            n = int(np.flatnonzero(ids[i]).max(initial=0)) + 1
            rows.append(call({k: v[i : i + 1, :n] for k, v in feed.items()})[0])
        logits = np.zeros((*ids.shape, rows[0].shape[-1]), dtype=rows[0].dtype)
        for i, row in enumerate(rows):
            logits[i, : len(row)] = row
        return logits

    return run


RUNTIMES: dict[str, Runtime] = {
    "paddle_inference": _paddle_inference,
    "onnxruntime": _onnxruntime,
    "paddle_lite": _paddle_lite,
}


class Predictor:
    """Inputs in, predictions out (``runtime.data`` documents their shape)."""

    def __init__(
        self,
        manifest: dict,
        tokenizer: CharTokenizer,
        run,
    ) -> None:
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.space = LabelSpace(manifest["task_kind"], tuple(manifest["labels"]))
        self.max_length = int(manifest["max_length"])
        self.threshold = float(manifest.get("threshold", 0.5))
        self._run = run
        self.transitions: np.ndarray | None = None  # a CRF tagger's (read_transitions)

    def read_transitions(self, export_dir: Path) -> None:
        """A CRF tagger's transitions ([C, C]), which the manifest's ``crf_file`` holds as
        JSON (read within the size such a matrix takes: the file comes with an upload)."""
        name = self.manifest.get("crf_file")
        if not name:
            return
        tags = len(self.space.tags)
        path = export_dir / name
        if path.stat().st_size > 64 * tags * tags + 1024:
            raise ValueError(f"{name} is larger than a {tags}×{tags} matrix of numbers")
        matrix = np.asarray(json.loads(path.read_text("utf-8")), dtype="float64")
        if matrix.shape != (tags, tags):
            raise ValueError(f"{name} is not a {tags}×{tags} matrix of tag transitions")
        self.transitions = matrix

    @classmethod
    def load(cls, export_dir: str | Path, device: str = "cpu") -> "Predictor":
        export_dir = Path(export_dir)
        manifest = read_manifest(export_dir)
        runtime = RUNTIMES.get(manifest["runtime"])
        if runtime is None:
            raise ValueError(f"unknown runtime {manifest['runtime']!r} in the manifest")
        tokenizer = CharTokenizer.from_file(export_dir / manifest["tokenizer"]["vocab"])
        predictor = cls(manifest, tokenizer, runtime(export_dir, manifest, device))
        predictor.read_transitions(export_dir)
        return predictor

    def predict(self, items: list, batch_size: int = 32) -> list[dict]:
        """``batch_size`` windows a model call; a long text is read in several
        (``data.predict``)."""
        return predict(
            self._run,
            self.tokenizer,
            self.space,
            items,
            self.max_length,
            self.threshold,
            self.transitions,
            batch_size,
        )
