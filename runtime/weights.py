"""Weights without unpickling: pickled checkpoints (Paddle's ``.pdparams``, PyTorch's ``.bin``
in the zip or the legacy format) converted to safetensors by a restricted unpickler, and the
runner's own states (optimizers) kept as safetensors plus a small JSON.

A pickle is a program: ``pickle.load`` calls whatever global it names, so a crafted
``model_state.pdparams`` runs code where it is loaded. The unpickler here resolves only what real
checkpoints hold (numpy's array reconstruction, ``collections.OrderedDict``, PyTorch's tensor
rebuild functions and storage types, re-implemented with numpy) and refuses anything else with
the name of the global it asked for. PyTorch's storages are read through ``persistent_load``
from the checkpoint's own zip members (or the legacy file's tail), bounds-checked.

No Django and no framework here: the platform converts at import, the runner reads and writes
the same formats.
"""

from __future__ import annotations

import json
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, ClassVar

import numpy as np

try:  # numpy 2 (the console's venv)
    from numpy._core import multiarray as _multiarray
except ImportError:  # numpy 1.x (the runtime venv)
    from numpy.core import multiarray as _multiarray  # type: ignore[no-redef]


class UnsafeWeights(ValueError):
    """A weights file that asks for what a checkpoint never holds, or that cannot be read."""


# numpy dtypes and their safetensors names; bfloat16 (which numpy lacks) travels as uint16.
SAFETENSORS_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}
NUMPY_DTYPES = {code: name for name, code in SAFETENSORS_DTYPES.items()} | {"BF16": "uint16"}
# PyTorch's storage types (as its pickles name them): numpy dtype and safetensors name.
TORCH_STORAGES = {
    "FloatStorage": ("float32", "F32"),
    "DoubleStorage": ("float64", "F64"),
    "HalfStorage": ("float16", "F16"),
    "BFloat16Storage": ("uint16", "BF16"),
    "LongStorage": ("int64", "I64"),
    "IntStorage": ("int32", "I32"),
    "ShortStorage": ("int16", "I16"),
    "CharStorage": ("int8", "I8"),
    "ByteStorage": ("uint8", "U8"),
    "BoolStorage": ("bool", "BOOL"),
}
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
TORCH_LEGACY_PROTOCOL = 1001
# Paddle's bookkeeping beside the weights of a state dict (not tensors).
PADDLE_META_KEYS = ("StructuredToParameterName@@", "UnpackBigParamInfor@@")
# A compressed member of a PyTorch zip may expand at most this many times (torch stores them
# uncompressed; a repacked one is read, a bomb is not).
MAX_MEMBER_RATIO = 100

# The tensors converted from one file may take at most this many times its size (real
# checkpoints take 1x; tied weights share a storage, which is counted for each name).
MAX_OUTPUT_RATIO = 2

# Files that are pickles by their name. Weights among them are converted; the others (optimizer
# and scheduler states, RNG states, Trainer arguments) are left out of an import.
PICKLE_SUFFIXES = (".pdparams", ".bin", ".pt", ".pth", ".ckpt", ".pdopt", ".pkl", ".pickle")
WEIGHT_SUFFIXES = (".pdparams", ".bin", ".pt", ".pth", ".ckpt")
NOT_WEIGHTS = ("optimizer", "scheduler", "rng_state", "training_args", "scaler")


@dataclass
class Tensor:
    """A tensor ready for safetensors: its dtype there and a contiguous little-endian array
    (bfloat16 as uint16)."""

    dtype: str
    array: np.ndarray

    @classmethod
    def of(cls, array: np.ndarray, source: str, name: str) -> Tensor:
        code = SAFETENSORS_DTYPES.get(array.dtype.name)
        if code is None:
            raise UnsafeWeights(
                f"{source}: {name} is an array of {array.dtype}; weights may only hold numbers"
            )
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        return cls(code, np.asarray(array, order="C"))  # 0-d stays 0-d


# -- The restricted unpickler ------------------------------------------------------------------


class _StorageType:
    """What ``torch.FloatStorage`` and friends resolve to: a dtype, never callable."""

    __slots__ = ("code", "dtype", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype, self.code = TORCH_STORAGES[name]

    def __setstate__(self, state: Any) -> None:
        raise UnsafeWeights(f"torch.{self.name} cannot be given a state")


class _Storage:
    __slots__ = ("code", "data", "dtype", "numel")

    def __init__(self, kind: _StorageType, numel: int) -> None:
        self.dtype, self.code, self.numel = np.dtype(kind.dtype), kind.code, numel
        self.data: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        raise UnsafeWeights("a storage cannot be given a state")


class _TensorRef:
    """A PyTorch tensor: a strided view of a storage, read once every storage is there."""

    __slots__ = ("offset", "size", "storage", "stride")

    def __init__(self, storage: _Storage, offset: int, size: tuple, stride: tuple) -> None:
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride

    def __setstate__(self, state: Any) -> None:
        raise UnsafeWeights("a tensor cannot be given a state")

    def nbytes(self) -> int:
        return int(np.prod(self.size, dtype=object)) * self.storage.dtype.itemsize

    def tensor(self, source: str, name: str) -> Tensor:
        st = self.storage
        if st.data is None:
            raise UnsafeWeights(f"{source}: the storage of {name} is missing")
        if any(n == 0 for n in self.size):
            return Tensor(st.code, np.zeros(self.size, dtype=st.dtype))
        last = self.offset + sum((n - 1) * s for n, s in zip(self.size, self.stride, strict=True))
        if last >= st.data.size:
            raise UnsafeWeights(f"{source}: {name} reaches past the end of its storage")
        # A view whose elements overlap (stride 0, or strides that fold back) would copy more
        # than its storage holds: a 4-byte storage seen as 10**8 x 10**8 with stride 0.
        extent = 1
        for n, s in sorted(
            (d for d in zip(self.size, self.stride, strict=True) if d[0] > 1), key=lambda d: d[1]
        ):
            if s < extent:
                raise UnsafeWeights(f"{source}: {name} is a view whose elements overlap")
            extent = s * (n - 1) + extent
        if self.nbytes() > st.data.nbytes:
            raise UnsafeWeights(f"{source}: {name} is larger than its storage")
        view = np.lib.stride_tricks.as_strided(
            st.data[self.offset :],
            shape=self.size,
            strides=[s * st.dtype.itemsize for s in self.stride],
            writeable=False,
        )
        return Tensor(st.code, view.copy(order="C"))


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple | list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise UnsafeWeights(f"a tensor's {what} is not a tuple of whole numbers: {value!r}")
    return tuple(value)


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any, *_: Any) -> Any:
    """``torch._utils._rebuild_tensor_v2`` (and v1): a view of ``storage``, checked."""
    if not isinstance(storage, _Storage):
        raise UnsafeWeights("a tensor is rebuilt from something that is not a storage")
    size, stride = _ints(size, "size"), _ints(stride, "stride")
    if len(size) != len(stride) or not isinstance(storage_offset, int) or storage_offset < 0:
        raise UnsafeWeights("a tensor's size, stride and offset do not fit together")
    return _TensorRef(storage, storage_offset, size, stride)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    """``torch._utils._rebuild_parameter``: a parameter is its tensor here."""
    if not isinstance(data, _TensorRef):
        raise UnsafeWeights("a parameter is rebuilt from something that is not a tensor")
    return data


def _numbers(found: Any) -> np.dtype:
    """``found`` if it is the dtype of an array of numbers (no Python objects, no records)."""
    if not isinstance(found, np.dtype) or found.hasobject or found.name not in SAFETENSORS_DTYPES:
        raise UnsafeWeights(f"an array of {found!r}; weights may only hold numbers")
    return found


def _dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    # How numpy pickles a dtype: dtype("f4", False, True), then a BUILD with its byte order.
    if not isinstance(spec, str) or spec.lstrip("<>|=")[:1] not in tuple("biuf"):
        raise UnsafeWeights(
            f"an array of {spec!r} (Python objects or records); weights may only hold numbers"
        )
    return _numbers(np.dtype(spec, bool(align), bool(copy)))


class _Array(np.ndarray):
    """The empty array numpy's ``_reconstruct`` makes; its BUILD (``__setstate__`` with the
    real shape, dtype and bytes) is checked by ``_Unpickler.load_build``."""


class _Callable:
    """An allowed global: callable, but a BUILD (setattr) on it is refused."""

    __slots__ = ("function", "name")

    def __init__(self, name: str, function: Callable[..., Any]) -> None:
        self.name, self.function = name, function

    def __call__(self, *args: Any) -> Any:
        return self.function(*args)

    def __setstate__(self, state: Any) -> None:
        raise UnsafeWeights(f"{self.name} cannot be given a state")


def _refuse_ndarray(*args: Any) -> Any:
    raise UnsafeWeights(
        "numpy.ndarray is called directly; arrays are only read as numpy pickles them "
        "(_reconstruct, then their bytes)"
    )


_NDARRAY = _Callable("numpy.ndarray", _refuse_ndarray)


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> _Array:
    # numpy's ndarray.__reduce__: _reconstruct(ndarray, (0,), b"b"), the data comes with BUILD.
    if subtype is not _NDARRAY or tuple(shape) != (0,) or dtype not in (b"b", "b"):
        raise UnsafeWeights("an array is reconstructed otherwise than numpy pickles one")
    return _Array((0,), dtype="b")


def _scalar(dtype: Any, data: Any = None) -> Any:
    if not isinstance(data, bytes) or len(data) != _numbers(dtype).itemsize:
        raise UnsafeWeights("a numpy scalar whose bytes do not fit its dtype")
    return _multiarray.scalar(dtype, data)


def _encode(text: Any, encoding: str = "utf-8") -> bytes:
    # How protocol 2 pickles bytes (Paddle's protocol-2 saves): ``_codecs.encode(str, "latin1")``.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafeWeights(f"_codecs.encode with {encoding!r}")
    return text.encode("latin1")


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("_codecs", "encode"): _Callable("_codecs.encode", _encode),
    ("torch._utils", "_rebuild_tensor_v2"): _Callable("_rebuild_tensor_v2", _rebuild_tensor),
    ("torch._utils", "_rebuild_tensor"): _Callable("_rebuild_tensor", _rebuild_tensor),
    ("torch._utils", "_rebuild_parameter"): _Callable("_rebuild_parameter", _rebuild_parameter),
    ("torch._utils", "_rebuild_parameter_with_state"): _Callable(
        "_rebuild_parameter_with_state", _rebuild_parameter
    ),
    **{("torch", name): _StorageType(name) for name in TORCH_STORAGES},
}
for _module in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ALLOWED[(_module, "_reconstruct")] = _Callable("_reconstruct", _reconstruct)
    _ALLOWED[(_module, "scalar")] = _Callable("scalar", _scalar)
_ALLOWED[("numpy", "ndarray")] = _NDARRAY
_ALLOWED[("numpy", "dtype")] = _Callable("numpy.dtype", _dtype)


def _array_state(state: Any) -> None:
    """An array's BUILD: (version, shape, dtype, Fortran order, raw bytes) whose bytes are
    exactly its shape's, so the data read bounds the array."""
    if isinstance(state, tuple) and len(state) == 5:
        state = state[1:]
    if not (isinstance(state, tuple) and len(state) == 4 and isinstance(state[3], bytes)):
        raise UnsafeWeights("an array is given a state otherwise than numpy pickles one")
    shape, dtype, raw = _ints(state[0], "shape"), _numbers(state[1]), state[3]
    if int(np.prod(shape, dtype=object)) * dtype.itemsize != len(raw):
        raise UnsafeWeights("an array's shape does not fit its bytes")


def _dtype_state(state: Any) -> None:
    # (version, byte order, subarray, names, fields, element size, alignment, flags[, meta])
    if not (
        isinstance(state, tuple)
        and len(state) in (8, 9)
        and state[1] in ("<", ">", "|", "=")
        and state[2:5] == (None, None, None)
        and state[5:8] == (-1, -1, 0)
    ):
        raise UnsafeWeights("a dtype is given a state otherwise than numpy pickles one")


class _Unpickler(pickle._Unpickler):
    """Python's own unpickler (its BUILD can be overridden, the C one's cannot), resolving
    only ``_ALLOWED``."""

    # The opcodes' table, called with this class's instances (load_build below).
    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = pickle._Unpickler.dispatch.copy()
    stack: list[Any]  # pickle's own (set by load()), which typeshed does not declare

    def load_build(self) -> None:
        """BUILD (``setstate``/setattr on the object below): numpy's arrays and dtypes, with
        their state checked, and an OrderedDict's attributes (PyTorch's ``_metadata``,
        dropped); on anything else (an allowed function's ``__defaults__``) refused."""
        state = self.stack.pop()
        inst = self.stack[-1]
        if type(inst) is _Array and inst.size == 0:
            _array_state(state)
            inst.__setstate__(state)
        elif type(inst) is np.dtype or isinstance(inst, np.dtype):
            _dtype_state(state)
            inst.__setstate__(state)  # type: ignore[attr-defined]  # numpy's stubs omit it
            _numbers(inst)
        elif type(inst) is OrderedDict and isinstance(state, dict | type(None)):
            pass
        else:
            what = inst.name if isinstance(inst, _Callable) else type(inst).__name__
            raise UnsafeWeights(
                f"{self.source} gives a state (BUILD) to {what}, which cannot be given a state"
            )

    dispatch[pickle.BUILD[0]] = load_build

    def __init__(
        self, file: IO[bytes], source: str, storage: Callable[[Any], Any] | None = None
    ) -> None:
        super().__init__(file)
        self.source = source
        self.storage = storage

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise UnsafeWeights(
                f"{self.source} asks for {module}.{name}; weights may only hold arrays"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        if self.storage is None:
            raise UnsafeWeights(f"{self.source} refers to an object outside itself: {pid!r}")
        return self.storage(pid)


def _storage_pid(pid: Any, source: str, length: int) -> tuple[_StorageType, str, int]:
    if not (
        isinstance(pid, tuple)
        and len(pid) == length
        and pid[0] == "storage"
        and isinstance(pid[1], _StorageType)
        and isinstance(pid[4], int)
        and pid[4] >= 0
    ):
        raise UnsafeWeights(f"{source} refers to an object that is not a storage: {pid!r}")
    return pid[1], str(pid[2]), pid[4]


def _load_torch_zip(path: Path, source: str) -> Any:
    with zipfile.ZipFile(path) as zf:
        pickles = [n for n in zf.namelist() if PurePosixPath(n).name == "data.pkl"]
        if len(pickles) != 1:
            raise UnsafeWeights(f"{source} is a zip but not a PyTorch checkpoint (no data.pkl)")
        prefix = pickles[0][: -len("data.pkl")]
        if prefix + "byteorder" in zf.namelist() and zf.read(prefix + "byteorder") != b"little":
            raise UnsafeWeights(f"{source} was saved on a big-endian machine")
        storages: dict[str, _Storage] = {}

        def storage(pid: Any) -> _Storage:
            kind, key, numel = _storage_pid(pid, source, 5)
            if key not in storages:
                try:
                    info = zf.getinfo(f"{prefix}data/{key}")
                except KeyError:
                    raise UnsafeWeights(f"{source} lacks the storage {key}") from None
                found = storages[key] = _Storage(kind, numel)
                size = numel * found.dtype.itemsize
                if info.file_size < size or info.file_size > max(info.compress_size, 1 << 20) * (
                    MAX_MEMBER_RATIO if info.compress_type else 1
                ):
                    raise UnsafeWeights(f"{source}: the storage {key} has the wrong size")
                found.data = np.frombuffer(zf.read(info)[:size], dtype=found.dtype)
            return storages[key]

        with zf.open(pickles[0]) as f:
            return _Unpickler(f, source, storage).load()


def _load_pickle(path: Path, source: str) -> Any:
    """A plain pickle (Paddle), or PyTorch's legacy format: pickles (magic number, protocol,
    system information, the object, its storage keys) followed by each storage's bytes."""
    with open(path, "rb") as f:
        first = _Unpickler(f, source).load()
        if not (type(first) is int and first == TORCH_LEGACY_MAGIC):
            return first
        if _Unpickler(f, source).load() != TORCH_LEGACY_PROTOCOL:
            raise UnsafeWeights(f"{source}: an unknown version of PyTorch's legacy format")
        info = _Unpickler(f, source).load()
        if not isinstance(info, dict) or info.get("little_endian") is not True:
            raise UnsafeWeights(f"{source} was saved on a big-endian machine")
        storages: dict[str, _Storage] = {}

        def storage(pid: Any) -> _Storage:
            kind, key, numel = _storage_pid(pid, source, 6)
            if pid[5] is not None:
                raise UnsafeWeights(f"{source} uses storage views, which are not supported")
            return storages.setdefault(key, _Storage(kind, numel))

        result = _Unpickler(f, source, storage).load()
        keys = _Unpickler(f, source).load()
        if not isinstance(keys, list):
            raise UnsafeWeights(f"{source}: no list of storages after the object")
        for key in keys:
            found = storages.get(str(key))
            if found is None:
                raise UnsafeWeights(f"{source} has data for a storage it never uses: {key!r}")
            head = f.read(8)
            if len(head) != 8 or struct.unpack("<q", head)[0] != found.numel:
                raise UnsafeWeights(f"{source}: the storage {key} has the wrong size")
            size = found.numel * found.dtype.itemsize
            raw = f.read(size)
            if len(raw) != size:
                raise UnsafeWeights(f"{source} ends inside the storage {key}")
            found.data = np.frombuffer(raw, dtype=found.dtype)
        return result


def load_checkpoint(path: Path, source: str | None = None) -> Any:
    """The object a pickled checkpoint holds, PyTorch tensors as ``_TensorRef``, arrays as
    numpy arrays; ``UnsafeWeights`` for anything else. ``source`` names it in errors."""
    source = source or path.name
    try:
        if zipfile.is_zipfile(path):
            return _load_torch_zip(path, source)
        return _load_pickle(path, source)
    except UnsafeWeights as exc:
        if str(exc).startswith(source):
            raise
        raise UnsafeWeights(f"{source}: {exc}") from None  # raised where the source is unknown
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise UnsafeWeights(f"{source} is not a readable checkpoint: {exc}") from exc
    except (TypeError, ValueError, AttributeError, IndexError, KeyError, struct.error) as exc:
        raise UnsafeWeights(f"{source} is not a checkpoint this platform reads: {exc}") from exc
    except (MemoryError, OverflowError, RecursionError) as exc:
        raise UnsafeWeights(
            f"{source} is not a checkpoint this platform reads: it asks for more memory or "
            f"nesting than a checkpoint takes ({type(exc).__name__})"
        ) from None


def state_tensors(obj: Any, source: str, max_bytes: int | None = None) -> dict[str, Tensor]:
    """Every tensor of a loaded checkpoint by its name (nested dictionaries joined by dots);
    Paddle's ``(name, array)`` pairs are arrays, its bookkeeping and plain values are left.
    ``max_bytes`` bounds their bytes together, counted before each is copied (many names may
    refer to one storage or array)."""
    found: dict[str, Tensor] = {}
    total = 0

    def count(prefix: str, nbytes: int) -> None:
        nonlocal total
        total += nbytes
        if max_bytes is not None and total > max_bytes:
            raise UnsafeWeights(
                f"{source}: its tensors (up to {prefix}) would take more than {max_bytes:,} "
                "bytes, more than the file holds"
            )

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], np.ndarray):
            value = value[1]  # paddle.save's (tensor name, array)
        if isinstance(value, _TensorRef):
            found[prefix] = value.tensor(source, prefix)  # at most its storage's bytes
            count(prefix, found[prefix].array.nbytes)
        elif isinstance(value, np.ndarray):
            count(prefix, value.nbytes)
            found[prefix] = Tensor.of(np.asarray(value), source, prefix)
        elif isinstance(value, dict):
            for key, item in value.items():
                if key in PADDLE_META_KEYS:
                    continue
                walk(f"{prefix}.{key}" if prefix else str(key), item)

    walk("", obj)
    if not found:
        raise UnsafeWeights(f"{source} holds no tensors")
    return found


# -- safetensors -------------------------------------------------------------------------------


def write_safetensors(
    path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None
) -> None:
    """The safetensors format written directly (numpy has no bfloat16 for the library's numpy
    writer): an 8-byte header length, the JSON header padded to 8 bytes, the data."""
    header: dict[str, Any] = {}
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        header[name] = {
            "dtype": t.dtype,
            "shape": list(t.array.shape),
            "data_offsets": [offset, offset + t.array.nbytes],
        }
        offset += t.array.nbytes
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in sorted(tensors):
            f.write(tensors[name].array.tobytes())


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """A safetensors file's tensors (memory-mapped), bfloat16 as uint16 with dtype BF16."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise UnsafeWeights(f"{path.name} is not a safetensors file")
        (length,) = struct.unpack("<Q", head)
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise UnsafeWeights(f"{path.name} is not a safetensors file: {exc}") from exc
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + length)
    found = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = np.dtype(NUMPY_DTYPES[meta["dtype"]])
        begin, end = meta["data_offsets"]
        array = data[begin:end].view(dtype).reshape(meta["shape"])
        found[name] = Tensor(meta["dtype"], array)
    return found


def refuse_pickles(directory: Path) -> None:
    """Before a framework loads a model directory: refuse one that holds pickles. PaddleNLP's
    ``from_pretrained`` falls back to ``paddle.load`` (an unpickling) whenever a
    ``model_state.pdparams`` is there and no safetensors, ``use_safetensors`` or not."""
    found = sorted(
        p.relative_to(directory).as_posix()
        for p in Path(directory).rglob("*")
        if p.suffix in PICKLE_SUFFIXES and p.is_file()
    )
    if found:
        raise UnsafeWeights(
            f"{', '.join(found)} in {directory} is a pickle, which this platform never loads: "
            "weights are read from safetensors only (import the model again to convert it)"
        )


# -- Converting a directory --------------------------------------------------------------------


def safetensors_name(name: str) -> str:
    """The safetensors file that replaces a pickled one, as the loaders look for it:
    ``model_state.pdparams`` and ``pytorch_model.bin`` (and their shards) → ``model…``,
    ``lora_model_state.pdparams`` → ``peft_model.safetensors``, else the same stem."""
    stem = name.rsplit(".", 1)[0]
    for old, new in (
        ("lora_model_state", "peft_model"),
        ("model_state", "model"),
        ("pytorch_model", "model"),
    ):
        if stem == old or stem.startswith(old + "-"):
            return new + stem[len(old) :] + ".safetensors"
    return stem + ".safetensors"


def write_index(path: Path, names: Any) -> None:
    """A one-shard index beside ``path`` (``<name>.index.json``), for loaders that find
    safetensors only through one (PaddleNLP's LoRA)."""
    index: dict[str, Any] = {"metadata": {"total_size": path.stat().st_size}, "weight_map": {}}
    index["weight_map"] = dict.fromkeys(names, path.name)
    path.with_name(path.name + ".index.json").write_text(json.dumps(index, indent=2), "utf-8")


def _is_weights(path: Path) -> bool:
    return path.suffix in WEIGHT_SUFFIXES and not any(w in path.name for w in NOT_WEIGHTS)


def convert_file(
    src: Path, dst: Path, source: str | None = None, max_bytes: int | None = None
) -> int:
    """Convert one pickled checkpoint to safetensors; returns the number of tensors. PaddleNLP
    reads ``format: np``, transformers ``format: pt``. The tensors may take at most
    MAX_OUTPUT_RATIO times the file's size (and ``max_bytes``)."""
    name = source or src.name
    limit = MAX_OUTPUT_RATIO * src.stat().st_size
    limit = limit if max_bytes is None else min(limit, max_bytes)
    try:
        tensors = state_tensors(load_checkpoint(src, source), name, limit)
        fmt = "np" if src.suffix == ".pdparams" else "pt"
        write_safetensors(dst, tensors, {"format": fmt})
    except (MemoryError, OverflowError, RecursionError) as exc:
        dst.unlink(missing_ok=True)
        raise UnsafeWeights(
            f"{name} is not a checkpoint this platform reads: it asks for more memory or "
            f"nesting than a checkpoint takes ({type(exc).__name__})"
        ) from None
    return len(tensors)


def _pickled_files(directory: Path) -> Iterator[Path]:
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.suffix in PICKLE_SUFFIXES:
            yield path


def convert_dir(directory: Path, max_bytes: int | None = None) -> dict[str, str]:
    """Replace every pickled file under ``directory``: weights (and sharded weights' index) by
    safetensors, other pickles (optimizer states, Trainer arguments) left out. Returns
    {relative path of the pickle: relative path of its safetensors, or "" when left out}.
    ``max_bytes`` bounds the safetensors written, all files together."""
    done: dict[str, str] = {}
    left = max_bytes

    def rel(p: Path) -> str:
        return p.relative_to(directory).as_posix()

    for index in sorted(directory.rglob("*.index.json")):
        if not index.name.endswith((".pdparams.index.json", ".bin.index.json")):
            continue
        try:
            meta = json.loads(index.read_text("utf-8"))
            shards = set(meta["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UnsafeWeights(f"{rel(index)} is not a weights index: {exc}") from exc
        for shard in shards:
            if not isinstance(shard, str) or PurePosixPath(shard).name != shard:
                raise UnsafeWeights(f"{rel(index)} names a shard outside its folder: {shard!r}")
        target = index.with_name(safetensors_name(index.name.removesuffix(".index.json")))
        new_index = target.with_name(target.name + ".index.json")
        if not new_index.exists():
            meta["weight_map"] = {k: safetensors_name(v) for k, v in meta["weight_map"].items()}
            new_index.write_text(json.dumps(meta, indent=2), "utf-8")
        done[rel(index)] = rel(new_index)
        index.unlink()

    for path in list(_pickled_files(directory)):
        if not _is_weights(path):
            done[rel(path)] = ""
            path.unlink()
            continue
        target = path.with_name(safetensors_name(path.name))
        if not target.exists():  # a safetensors file beside the pickle wins
            convert_file(path, target, rel(path), left)
            if left is not None:
                left -= target.stat().st_size
            if target.name == "peft_model.safetensors":  # PaddleNLP finds LoRA by its index
                write_index(target, read_safetensors(target))
        done[rel(path)] = rel(target)
        path.unlink()
    return done


# -- The runner's own states (optimizers) --------------------------------------------------------


def split_state(tree: Any, as_array: Callable[[Any], Any | None]) -> tuple[Any, dict[str, Any]]:
    """A nested state (an optimizer's ``state_dict``) as JSON plus its tensors by key:
    ``as_array(value)`` gives a value's tensor for the safetensors file, or None when it is
    not one. Dictionaries keep their keys' types (PyTorch's are parameter numbers)."""
    tensors: dict[str, Any] = {}

    def enc(value: Any) -> Any:
        found = as_array(value)
        if found is not None:
            key = str(len(tensors))
            tensors[key] = found
            return {"__tensor__": key}
        if isinstance(value, dict):
            return {"__items__": [[enc(k), enc(v)] for k, v in value.items()]}
        if isinstance(value, tuple):
            return {"__tuple__": [enc(v) for v in value]}
        if isinstance(value, list):
            return [enc(v) for v in value]
        if isinstance(value, np.generic):
            return value.item()
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise TypeError(f"a state cannot keep a {type(value).__name__}")

    return enc(tree), tensors


def join_state(structure: Any, tensors: dict[str, Any]) -> Any:
    """The inverse of ``split_state``, with the tensors as loaded."""

    def dec(value: Any) -> Any:
        if isinstance(value, dict):
            if "__tensor__" in value:
                return tensors[value["__tensor__"]]
            if "__tuple__" in value:
                return tuple(dec(v) for v in value["__tuple__"])
            return {_key(dec(k)): dec(v) for k, v in value["__items__"]}
        if isinstance(value, list):
            return [dec(v) for v in value]
        return value

    return dec(structure)


def _key(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def save_state(
    stem: Path,
    tree: Any,
    as_array: Callable[[Any], Any | None],
    save_tensors: Callable[[dict[str, Any], Path], None],
) -> None:
    """``stem``.safetensors (written by ``save_tensors``, the framework's safetensors writer)
    and ``stem``.json."""
    structure, tensors = split_state(tree, as_array)
    save_tensors(tensors, stem.with_name(stem.name + ".safetensors"))
    stem.with_name(stem.name + ".json").write_text(json.dumps(structure), "utf-8")


def load_state(stem: Path, load_tensors: Callable[[Path], dict[str, Any]]) -> Any:
    structure = json.loads(stem.with_name(stem.name + ".json").read_text("utf-8"))
    return join_state(structure, load_tensors(stem.with_name(stem.name + ".safetensors")))
