"""Many LoRA adapters over one served causal LM: each request's rows decode with the adapter it
names (or none), in one batch, on one copy of the base weights.

An adapter is the ``adapter/`` directory of a LoRA version's export (PaddleNLP's
``peft_model.safetensors`` + ``lora_config.json``, or peft's ``adapter_model.safetensors`` +
``adapter_config.json``), fine-tuned from the same base model as the served one. A forward hook
on each adapted linear layer adds, for every row, ``x · A · B · scaling`` of its adapter (the
adapters' matrices stacked once per layer, gathered per row, two batched matmuls).

The served export is itself a LoRA version with its adapter merged into the weights (``W +
A₀B₀``): a row with another adapter also subtracts the served one's own delta, so that it runs
on ``W`` plus its own adapter, as that version's merged export would (up to float rounding).
Memory is the served model's plus each adapter's matrices, not a merged copy per adapter.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.weights import refuse_pickles

ADAPTER_DIR = "adapter"  # in a LoRA version's export
MAX_ADAPTERS = 64  # loaded at once by one generation process
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,59}")  # an adapter's name in OpenAI's ``model``
# PaddleNLP's and peft's file names, by the runtime that trained them.
FILES = {
    "paddle_generate": ("lora_config.json", "peft_model.safetensors"),
    "torch_generate": ("adapter_config.json", "adapter_model.safetensors"),
}


class AdapterError(ValueError):
    """An adapter that cannot be applied to the served model, and why."""


@dataclass
class LoRA:
    """Per adapted layer (the served model's module name): ``A`` [in, r] and ``B`` [r, out]
    with the adapter's scaling folded into ``B``."""

    layers: dict[str, tuple[np.ndarray, np.ndarray]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.layers.values())


def read_adapter(directory: Path, runtime: str) -> LoRA:
    """The adapter in ``directory`` as the ``runtime`` (``paddle_generate`` or
    ``torch_generate``) trained it; AdapterError for another format or an unsupported variant."""
    from safetensors.numpy import load_file

    if runtime not in FILES:
        raise AdapterError(f"adapters are served on generative models only, not {runtime!r}")
    config_name, weights_name = FILES[runtime]
    refuse_pickles(directory)
    if not (directory / config_name).is_file() or not (directory / weights_name).is_file():
        other = next((r for r, (c, _) in FILES.items() if (directory / c).is_file()), None)
        why = f"an adapter of {other}" if other else "no LoRA adapter"
        raise AdapterError(
            f"{directory} holds {why}; a {runtime} model serves adapters trained with the "
            f"same backend ({config_name} and {weights_name})"
        )
    config = json.loads((directory / config_name).read_text("utf-8"))
    tensors = load_file(str(directory / weights_name))
    if runtime == "paddle_generate":
        return _paddle(config, tensors)
    return _peft(config, tensors)


def _paddle(config: dict, tensors: dict[str, np.ndarray]) -> LoRA:
    """PaddleNLP: ``<module>.lora_A`` [in, r], ``<module>.lora_B`` [r, out]; ``scaling`` in
    its config."""
    for flag in ("use_mora", "pissa", "lora_use_mixer", "do_qat", "loraga"):
        if config.get(flag):
            raise AdapterError(f"LoRA variants ({flag}) are not served as adapters")
    scaling = float(config.get("scaling") or config["lora_alpha"] / config["r"])
    layers = {}
    for key, a in tensors.items():
        if key.endswith(".lora_A"):
            module = key[: -len(".lora_A")]
            b = tensors.get(module + ".lora_B")
            if b is None:
                raise AdapterError(f"{module}.lora_B is missing")
            layers[module] = (a.astype("float32"), (b * scaling).astype("float32"))
    return _checked(layers)


def _peft(config: dict, tensors: dict[str, np.ndarray]) -> LoRA:
    """peft: ``base_model.model.<module>.lora_A.weight`` [r, in], ``….lora_B.weight`` [out, r];
    alpha / r (or / √r with rsLoRA), per module where its patterns say."""
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"a {config.get('peft_type')} adapter is not LoRA")
    for flag in ("use_dora", "lora_bias", "fan_in_fan_out"):
        if config.get(flag):
            raise AdapterError(f"LoRA variants ({flag}) are not served as adapters")
    prefix = "base_model.model."
    layers = {}
    for key, a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[: -len(".lora_A.weight")]
        b = tensors.get(module + ".lora_B.weight")
        if b is None:
            raise AdapterError(f"{module}.lora_B.weight is missing")
        module = module.removeprefix(prefix)
        rank = a.shape[0]
        alpha = float(config.get("lora_alpha") or rank)
        for pattern, value in (config.get("alpha_pattern") or {}).items():
            if re.search(pattern, module):
                alpha = float(value)
        scaling = alpha / (rank**0.5 if config.get("use_rslora") else rank)
        layers[module] = (a.T.astype("float32"), (b.T * scaling).astype("float32"))
    return _checked(layers)


def _checked(layers: dict[str, tuple[np.ndarray, np.ndarray]]) -> LoRA:
    if not layers:
        raise AdapterError("the adapter has no LoRA weights")
    for module, (a, b) in layers.items():
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise AdapterError(f"{module}: LoRA matrices of shapes {a.shape} and {b.shape}")
    return LoRA(layers)


class Adapters:
    """The adapters of one served model (``runtime.generation.PaddleLM`` or ``TorchLM``),
    applied per row: ``route(names)`` before a forward says each row's adapter ("" for
    none). ``own``: the served export's merged adapter, if any, subtracted on adapted rows."""

    def __init__(self, lm, own: LoRA | None = None) -> None:
        self.lm = lm
        self.paddle = hasattr(lm, "paddle")
        self.modules = dict(lm.model.named_sublayers() if self.paddle else lm.model.named_modules())
        self.own = self._tensors(own) if own is not None else {}
        self.loaded: dict[str, LoRA] = {}
        self.index: dict[str, int] = {}  # name → its place in every layer's stack (1…)
        self.stacks: dict[str, tuple] = {}  # module → (A [N+1, in, R], B [N+1, R, out])
        self.rows = None  # the routed rows' stack indices (a framework tensor), or None
        self.adapted = None  # [rows, 1, 1]: 1 where the row has an adapter
        self.hooks: dict[str, Any] = {}  # module → its hook's handle (``remove()``)

    def __contains__(self, name: str) -> bool:
        return name in self.loaded

    def names(self) -> list[str]:
        return sorted(self.loaded)

    def load(self, name: str, lora: LoRA) -> None:
        """Add (or replace) adapter ``name``; AdapterError where it does not fit the model."""
        if not NAME.fullmatch(name):
            raise AdapterError(f"{name!r} is not an adapter name (a-z, 0-9, _ and -)")
        if name not in self.loaded and len(self.loaded) >= MAX_ADAPTERS:
            raise AdapterError(f"{MAX_ADAPTERS} adapters are loaded already")
        for module, (a, b) in lora.layers.items():
            layer = self.modules.get(module)
            if layer is None:
                raise AdapterError(f"the served model has no layer {module}")
            size_in, size_out = self._shape(layer)
            if (a.shape[0], b.shape[1]) != (size_in, size_out):
                raise AdapterError(
                    f"{module}: the adapter is {a.shape[0]}→{b.shape[1]}, the served model's "
                    f"layer {size_in}→{size_out} (an adapter of another base model?)"
                )
        self.loaded[name] = lora
        self._rebuild()

    def unload(self, name: str) -> None:
        if self.loaded.pop(name, None) is not None:
            self._rebuild()

    def _shape(self, layer) -> tuple[int, int]:
        weight = layer.weight
        if self.paddle:  # paddle's Linear: [in, out]
            return int(weight.shape[0]), int(weight.shape[1])
        return int(weight.shape[1]), int(weight.shape[0])

    def _tensors(self, lora: LoRA) -> dict[str, tuple]:
        return {m: (self._tensor(a), self._tensor(b)) for m, (a, b) in lora.layers.items()}

    def _tensor(self, array: np.ndarray):
        if self.paddle:
            return self.lm.paddle.to_tensor(array)
        return self.lm.torch.from_numpy(np.ascontiguousarray(array)).to(self.lm.device)

    def _rebuild(self) -> None:
        """Every adapted layer's stacks: index 0 is no adapter (zeros), rank padded to the
        largest; a hook on each layer an adapter (or the served one's own) touches."""
        names = sorted(self.loaded)
        self.index = {n: i + 1 for i, n in enumerate(names)}
        modules = {m for lora in self.loaded.values() for m in lora.layers}
        self.stacks = {}
        for module in sorted(modules):
            size_in, size_out = self._shape(self.modules[module])
            rank = max(
                lora.layers[module][0].shape[1]
                for lora in self.loaded.values()
                if module in lora.layers
            )
            a_stack = np.zeros((len(names) + 1, size_in, rank), "float32")
            b_stack = np.zeros((len(names) + 1, rank, size_out), "float32")
            for n in names:
                if module in self.loaded[n].layers:
                    a, b = self.loaded[n].layers[module]
                    a_stack[self.index[n], :, : a.shape[1]] = a
                    b_stack[self.index[n], : b.shape[0]] = b
            self.stacks[module] = (self._tensor(a_stack), self._tensor(b_stack))
        for module in modules | set(self.own):
            if module not in self.hooks:
                self.hooks[module] = self._hook(module)
        for module in set(self.hooks) - modules - set(self.own):
            self.hooks.pop(module).remove()

    def route(self, names: list[str]) -> None:
        """The rows of the next forward: each one's adapter ("" for none); KeyError for one
        not loaded."""
        if not any(names):
            self.rows = self.adapted = None
            return
        index = np.asarray([self.index[n] if n else 0 for n in names], "int64")
        flags = (index > 0).astype("float32")[:, None, None]
        self.rows, self.adapted = self._tensor(index), self._tensor(flags)

    def _hook(self, module: str):
        layer = self.modules[module]

        def delta(x):
            if x.ndim == 2:  # [rows, in]: one token each
                return delta(x[:, None])[:, 0]
            out = 0
            stacks = self.stacks.get(module)
            if stacks is not None:
                a, b = stacks
                if self.paddle:
                    import paddle

                    pick = lambda t: paddle.index_select(t, self.rows, axis=0)  # noqa: E731
                    out = paddle.bmm(paddle.bmm(x, pick(a)), pick(b))
                else:
                    out = (x @ a.index_select(0, self.rows)) @ b.index_select(0, self.rows)
            own = self.own.get(module)
            if own is not None:
                out = out - ((x @ own[0]) @ own[1]) * self.adapted
            return out

        if self.paddle:

            def post(_layer, inputs, output):
                return output if self.rows is None else output + delta(inputs[0])

            return layer.register_forward_post_hook(post)

        def forward_hook(_module, args, output):
            return output if self.rows is None else output + delta(args[0])

        return layer.register_forward_hook(forward_hook)
