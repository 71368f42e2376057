"""Generation from an exported causal LM (runtimes ``paddle_generate`` and ``torch_generate``):
the one engine that the serving host's replicas, the evaluation and the benchmark run.

Requests are generated together in a ``Batch`` (continuous batching): a request joins the
running rows at the next step (its prompt prefilled, its key/value cache appended to theirs,
left-padded) and leaves as soon as it ends (a stop token, one of its stop strings, or its token
limit), while the others go on; each step decodes one token for every row and reports what
every request's text grew by, so the caller can stream it. Sampling is per request
(temperature, top-p, seed); temperature 0 is greedy.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime.adapters import Adapters, read_adapter
from runtime.chat import ChatTokenizer
from runtime.inference import read_manifest
from runtime.weights import refuse_pickles

RUNTIMES = ("paddle_generate", "torch_generate")
MIN_PREFIX = 16  # a shorter shared prefix is prefilled with the rest of its prompt
PREFIX_CACHE = 8  # shared prefixes a batch keeps the cache of


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    id: int = 0
    # The prompt's first tokens that other requests share (a system prompt): prefix-cached.
    prefix_tokens: int = 0
    # The LoRA adapter it runs with (runtime.adapters), "" for the served model itself.
    adapter: str = ""
    # No stop token is sampled before this many tokens (vLLM's min_tokens). Last: the fields
    # before it are given by position.
    min_tokens: int = 0


@dataclass
class Delta:
    """What a request's completion grew by in one step; ``finish_reason`` on its last."""

    id: int
    text: str
    finish_reason: str | None = None
    completion_tokens: int = 0


def position_ids(mask: np.ndarray) -> np.ndarray:
    """Positions that skip left padding, so a padded prompt generates as it would alone."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype("int64")


def sample(logits: np.ndarray, temperature: float, top_p: float, rng) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype("float64") / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p)
        keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)]
        q = np.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    return int(rng.choice(len(p), p=p))


class _Stream:
    """One request in a batch: its tokens, and the text sent so far (held back while it may
    still end in a stop string or in half a character)."""

    def __init__(self, request: GenerationRequest, tokenizer: ChatTokenizer) -> None:
        self.request = request
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # what has been sent
        self.finish: str | None = None
        self.rng = np.random.default_rng(request.seed)
        self.hold = max((len(s) for s in request.stop), default=1) - 1

    def add(self, token: int, stop_ids: set[int]) -> Delta:
        if token in stop_ids:
            self.finish = "stop"
        else:
            self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        for s in self.request.stop:
            found = text.find(s, max(0, len(self.text) - len(s)))
            if found != -1:
                text, self.finish = text[:found], "stop"
        if self.finish is None and len(self.ids) >= self.request.max_tokens:
            self.finish = "length"
        if self.finish is None:
            end = len(text) - self.hold
            if text.endswith("\ufffd"):  # a character whose bytes are not all out yet
                end = min(end, len(text) - 1)
        else:
            end = len(text)
        piece = text[len(self.text) : max(end, len(self.text))]
        self.text += piece
        return Delta(self.request.id, piece, self.finish, len(self.ids))


class Generator:
    def __init__(self, export_dir: Path, device: str = "cpu", verify: bool = True) -> None:
        export_dir = Path(export_dir)
        self.manifest = read_manifest(export_dir, verify=verify)
        runtime = self.manifest.get("runtime")
        if runtime not in RUNTIMES:
            raise ValueError(f"{export_dir} is not a generative model (runtime {runtime!r})")
        self.tokenizer = ChatTokenizer(export_dir)
        config = json.loads((export_dir / "config.json").read_text("utf-8"))
        self.context_length = int(
            config.get("max_position_embeddings") or self.manifest.get("max_length") or 2048
        )
        lm = PaddleLM if runtime == "paddle_generate" else TorchLM
        self.lm = lm.load(export_dir, device)
        self.export_dir = export_dir
        self.adapters: Adapters | None = None

    def load_adapter(self, name: str, directory: Path) -> int:
        """Serve the LoRA adapter in ``directory`` as ``name`` (requests with that ``adapter``
        run with it); its size in bytes. AdapterError where it does not fit this model."""
        runtime = self.manifest["runtime"]
        lora = read_adapter(Path(directory), runtime)
        if self.adapters is None:
            own = self.manifest.get("adapter_dir")
            merged = read_adapter(self.export_dir / own, runtime) if own else None
            self.adapters = Adapters(self.lm, merged)
            self.lm.adapters = self.adapters
        self.adapters.load(name, lora)
        return lora.nbytes

    def unload_adapter(self, name: str) -> None:
        if self.adapters is not None:
            self.adapters.unload(name)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        return self.tokenizer.prompt_ids(messages)

    def batch(self, static: bool = False) -> "Batch":
        """An empty batch that requests join and leave as they come (continuous batching)."""
        return Batch(self.lm, self.tokenizer, static)

    def generate(
        self,
        requests: list[GenerationRequest],
        on_step: Callable[[list[Delta]], None] | None = None,
    ) -> list[str]:
        return generate(self.lm, self.tokenizer, requests, on_step)


def generate(
    lm, tokenizer: ChatTokenizer, requests: list[GenerationRequest], on_step=None
) -> list[str]:
    """Generate for every request together with ``lm``; ``on_step`` gets each step's deltas.
    Returns the completions."""
    batch = Batch(lm, tokenizer)
    streams = batch.add(requests)
    while len(batch):
        deltas = batch.step()
        if on_step is not None and deltas:
            on_step(deltas)
    return [s.text for s in streams]


def _left_pad(a: np.ndarray, n: int) -> np.ndarray:
    return np.pad(a, ((0, 0), (n, 0))) if n else a


class Batch:
    """The rows generating together, with continuous batching: requests join at the next step
    (``add``: their prompts prefilled together, their key/value cache left-padded to the
    running one's length and appended) and leave as soon as they are done (``step``), each row
    with its own positions and attention mask, so that a row decodes as it would alone. ``lm``:
    ``forward(ids, mask, positions, cache) → (last logits, cache)`` and the cache's ``select``
    (rows), ``trim`` (leading columns) and ``join`` (two caches, each left-padded)."""

    def __init__(self, lm, tokenizer: ChatTokenizer, static: bool = False) -> None:
        self.lm, self.tokenizer = lm, tokenizer
        # Static batching, the engine before this one: rows that are done stay in the batch
        # (decoding padding) until every row is; the benchmark's baseline.
        self.static = static
        self.stop_ids = set(tokenizer.stop_ids)
        self.streams: list[_Stream] = []
        self.cache = None
        self.mask: np.ndarray = np.zeros((0, 0), "int64")  # [rows, cache columns]: 1 if real
        self.positions: np.ndarray = np.zeros((0, 1), "int64")  # each row's next position
        self.logits: np.ndarray = np.zeros((0, 0), "float32")  # [rows, vocabulary]: next
        # Shared prompt prefixes' caches (one row each) by adapter, the most recently used last.
        self.prefixes: dict[tuple[str, tuple[int, ...]], object] = {}
        self.prefix_hits = 0

    def __len__(self) -> int:
        """The requests still generating (a row that is done may keep its slot a while;
        static batching holds it until every row is done)."""
        if self.static:
            return len(self.streams)
        return sum(s.finish is None for s in self.streams)

    def add(self, requests: list[GenerationRequest]) -> list["_Stream"]:
        """Prefill the requests' prompts; they sample their first token at the next step. A
        request's ``prefix_tokens`` (a system prompt the endpoint's requests share) are read
        from the prefix cache when an earlier request prefilled them."""
        groups: dict[tuple[str, tuple[int, ...]], list[GenerationRequest]] = {}
        for r in requests:
            # At least the prompt's last token is prefilled: its logits pick the first token.
            cut = min(r.prefix_tokens, len(r.prompt_ids) - 1)
            key = tuple(r.prompt_ids[:cut]) if cut >= MIN_PREFIX else ()
            # A prefix's cache is its adapter's: the adapters change the keys and values.
            groups.setdefault((r.adapter if key else "", key), []).append(r)
        streams = []
        for (adapter, prefix), group in groups.items():
            streams += self._append(group, *self._prefill(group, adapter, prefix))
        order = {id(r): i for i, r in enumerate(requests)}
        return sorted(streams, key=lambda s: order[id(s.request)])

    def _prefill(self, requests: list[GenerationRequest], adapter: str, prefix: tuple[int, ...]):
        """Logits, cache, mask and positions of the requests' prompts after ``prefix`` (whose
        cache, with ``adapter``, is the prefix cache's, prefilled once)."""
        pad, start = self.tokenizer.pad_id, len(prefix)
        cache = None
        if prefix:
            cache = self._prefix_cache(adapter, prefix)
            cache = self.lm.select(cache, [0] * len(requests))  # a copy per row
        width = max(len(r.prompt_ids) for r in requests) - start
        ids = np.full((len(requests), width), pad, dtype="int64")
        mask = np.zeros((len(requests), start + width), dtype="int64")
        mask[:, :start] = 1
        for i, r in enumerate(requests):
            rest = r.prompt_ids[start:]
            ids[i, width - len(rest) :] = rest
            mask[i, start + width - len(rest) :] = 1
        positions = position_ids(mask)[:, start:]
        rows = [r.adapter for r in requests]
        logits, cache = self._forward(ids, mask, positions, cache, rows)
        return logits, cache, mask, positions[:, -1:] + 1

    def _forward(self, ids, mask, positions, cache, adapters: list[str]):
        """``lm.forward`` with each row's adapter, where the model serves adapters."""
        if any(adapters) or self.lm.adapters is not None:
            if self.lm.adapters is None:
                raise KeyError(f"no adapter is loaded, not {sorted(set(adapters) - {''})}")
            self.lm.adapters.route(adapters)
        return self.lm.forward(ids, mask, positions, cache)

    def _prefix_cache(self, adapter: str, prefix: tuple[int, ...]):
        key = (adapter, prefix)
        cached = self.prefixes.pop(key, None)
        if cached is None:
            ids = np.asarray([prefix], dtype="int64")
            mask = np.ones_like(ids)
            # Kept as it is: every use takes a copy per row (_prefill), which forward extends.
            _logits, cached = self._forward(ids, mask, position_ids(mask), None, [adapter])
            if len(self.prefixes) >= PREFIX_CACHE:
                self.prefixes.pop(next(iter(self.prefixes)))  # the least recently used
        else:
            self.prefix_hits += 1
        self.prefixes[key] = cached
        return cached

    def _append(self, requests, logits, cache, mask, positions) -> list["_Stream"]:
        """The prefilled requests become rows of the batch: in the slots of rows that are done
        (their key/value cache written over, left-padded to the batch's columns), else
        appended."""
        streams = [_Stream(r, self.tokenizer) for r in requests]
        if not self.streams:
            self.cache, self.mask, self.logits, self.positions = cache, mask, logits, positions
            self.streams = streams
            return streams
        free = [i for i, s in enumerate(self.streams) if s.finish is not None]
        width, columns = mask.shape[1], self.mask.shape[1]
        reused = min(len(free), len(streams)) if width <= columns and not self.static else 0
        if reused:
            slots = free[:reused]
            written = (
                cache if reused == len(streams) else self.lm.select(cache, list(range(reused)))
            )
            self.lm.write(self.cache, slots, written, columns - width)
            self.mask[slots] = _left_pad(mask[:reused], columns - width)
            self.positions[slots] = positions[:reused]
            self.logits[slots] = logits[:reused]
            for slot, stream in zip(slots, streams, strict=False):
                self.streams[slot] = stream
        if reused < len(streams):
            rest = list(range(reused, len(streams)))
            if reused:
                cache = self.lm.select(cache, rest)
            mask, positions, logits = mask[rest], positions[rest], logits[rest]
            width = mask.shape[1]
            columns = max(self.mask.shape[1], width)
            extra, extra_new = columns - self.mask.shape[1], columns - width
            self.cache = self.lm.join(self.cache, extra, cache, extra_new)
            self.mask = np.concatenate([_left_pad(self.mask, extra), _left_pad(mask, extra_new)])
            self.positions = np.concatenate([self.positions, positions])
            self.logits = np.concatenate([self.logits, logits])
            self.streams += streams[reused:]
        return streams

    def cancel(self, ids: set[int]) -> None:
        """The requests of these ids leave at the next step, their clients gone."""
        for s in self.streams:
            if s.request.id in ids and s.finish is None:
                s.finish = "cancelled"

    def step(self) -> list[Delta]:
        """Every row's next token; the rows that are done leave, the others decode it. A row
        that is done keeps its slot (decoding padding, masked) for a request that joins later,
        until more than half the rows are done: then the batch is compacted. Columns that no
        live row attends to are trimmed once they are a quarter of the cache."""
        tokens: np.ndarray = np.zeros(len(self.streams), dtype="int64")
        deltas = []
        for i, s in enumerate(self.streams):
            if s.finish is not None:  # cancelled (or, static, done): it leaves below
                continue
            logits = self.logits[i]
            if len(s.ids) < s.request.min_tokens and self.stop_ids:
                logits = logits.copy()
                logits[list(self.stop_ids)] = -np.inf
            tokens[i] = sample(logits, s.request.temperature, s.request.top_p, s.rng)
            delta = s.add(int(tokens[i]), self.stop_ids)
            if delta.text or delta.finish_reason:
                deltas.append(delta)
        live = [i for i, s in enumerate(self.streams) if s.finish is None]
        if not live:
            self.streams, self.cache = [], None
            return deltas
        dead = [i for i, s in enumerate(self.streams) if s.finish is not None]
        tokens[dead] = self.tokenizer.pad_id
        if not self.static:
            # Columns no live row attends to (left padding, and the slots of rows done).
            padding = int(np.argmax(self.mask[live].any(axis=0)))
            if len(dead) * 2 > len(self.streams):
                self.streams = [self.streams[i] for i in live]
                tokens, self.mask = tokens[live], self.mask[live]
                self.positions = self.positions[live]
                self.cache = self.lm.select(self.cache, live)
                dead = []
            if padding and (not dead or padding * 4 >= self.mask.shape[1]):
                self.mask = self.mask[:, padding:]
                self.cache = self.lm.trim(self.cache, padding)
        # Static batching: the rows that are done decode padding, attended, as they did.
        column = np.ones((len(self.streams), 1), "int64")
        if not self.static:
            column[dead] = 0
        self.mask = np.concatenate([self.mask, column], axis=1)
        rows = [s.request.adapter if s.finish is None else "" for s in self.streams]
        self.logits, self.cache = self._forward(
            tokens[:, None], self.mask, self.positions, self.cache, rows
        )
        self.positions = self.positions + 1
        return deltas


class TorchLM:
    """A transformers causal LM (or a peft-wrapped one, in training) as the engine runs it."""

    def __init__(self, model, device) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.device = device
        self.adapters: Adapters | None = None
        self.model.eval()

    @classmethod
    def load(cls, export_dir: Path, device: str) -> "TorchLM":
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM

        refuse_pickles(export_dir)
        target = torch.device("cuda" if device.startswith("gpu") else "cpu")
        model = AutoModelForCausalLM.from_pretrained(
            str(export_dir), torch_dtype=torch.float32, local_files_only=True, use_safetensors=True
        ).to(target)
        return cls(model, target)

    def forward(self, ids, mask, positions, cache):
        torch = self.torch

        def tensor(a):
            return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

        with torch.inference_mode():
            out = self.model(
                input_ids=tensor(ids),
                attention_mask=tensor(mask),
                position_ids=tensor(positions),
                past_key_values=cache,
                use_cache=True,
            )
        return out.logits[:, -1].float().cpu().numpy(), out.past_key_values

    # The cache as transformers' legacy layers: per layer (key, value), [rows, heads, columns, dim].
    def _layers(self, cache) -> tuple:
        return cache.to_legacy_cache() if hasattr(cache, "to_legacy_cache") else cache

    def _cache(self, layers):
        from transformers import DynamicCache

        return DynamicCache.from_legacy_cache(tuple(tuple(kv) for kv in layers))

    def select(self, cache, rows: list[int]):
        index = self.torch.tensor(rows, device=self.device)
        return self._cache([[t.index_select(0, index) for t in kv] for kv in self._layers(cache)])

    def trim(self, cache, columns: int):
        return self._cache([[t[:, :, columns:] for t in kv] for kv in self._layers(cache)])

    def write(self, cache, slots: list[int], other, pad: int) -> None:
        """The rows of ``other`` into rows ``slots`` of ``cache``, in place, left-padded by
        ``pad`` columns."""
        torch = self.torch
        index = torch.tensor(slots, device=self.device)
        with torch.inference_mode():  # the cache's tensors are inference tensors
            for kv, other_kv in zip(self._layers(cache), self._layers(other), strict=True):
                for t, o in zip(kv, other_kv, strict=True):
                    t.index_copy_(0, index, torch.nn.functional.pad(o, (0, 0, pad, 0)))

    def join(self, cache, pad: int, other, other_pad: int):
        def padded(t, n):  # n columns of zeros before the first (dim -2)
            return self.torch.nn.functional.pad(t, (0, 0, n, 0)) if n else t

        return self._cache(
            [
                [
                    self.torch.cat([padded(a, pad), padded(b, other_pad)])
                    for a, b in zip(x, y, strict=True)
                ]
                for x, y in zip(self._layers(cache), self._layers(other), strict=True)
            ]
        )


def _einsum_attention(original: Callable) -> Callable:
    """PaddleNLP's attention without flash attention (a CPU's) transposes the key and value
    cache and multiplies one small matrix per row and head: at a decoding step of 16 rows and
    200 columns that is ten times the cost of two einsums over the cache as it is laid out
    ([rows, columns, heads, dim]). The same arithmetic, for a model in inference (an export
    served or evaluated, never one in training); anything else takes the original path."""
    import math

    import paddle
    import paddle.nn.functional as F

    def attention(query, config, key, value, mask, output_attentions, *args, **kwargs):
        plain = (
            mask is not None
            and not output_attentions
            and not args
            and not getattr(config, "use_flash_attention", False)
            and not kwargs.get("sequence_parallel")
            and all(
                kwargs.get(k) is None
                for k in ("alibi", "reshard_layer", "attn_mask_startend_row_indices")
            )
        )
        if not plain:
            return original(query, config, key, value, mask, output_attentions, *args, **kwargs)
        rows, length, heads, dim = query.shape
        scores = paddle.einsum("bqhd,bthd->bhqt", query * (1 / math.sqrt(dim)), key)
        scores = scores + mask.reshape([rows, 1, length, key.shape[1]]).expand(scores.shape)
        weights = F.softmax(scores.astype("float32"), axis=-1).astype(query.dtype)
        out = paddle.einsum("bhqt,bthd->bqhd", weights, value)
        return out.reshape([rows, length, heads * dim])

    attention.original = original  # type: ignore[attr-defined]
    return attention


# Paddle's CPU kernels are ~40 times slower on an elementwise operation that broadcasts (a
# [rows, tokens, 1, dim] by a [rows, tokens, heads, dim]) than on two tensors of one shape, and
# its ``pow`` is ~4 times slower than a square: PaddleNLP's RMSNorm and rotary embedding were a
# fifth of a prefill. The fast paths below expand first; the arithmetic is the same.
RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm")
ROTARY_MODULES = ("paddlenlp.transformers.llama.modeling", "paddlenlp.transformers.qwen2.modeling")


def _rms_norm(layer) -> Callable:
    import paddle

    def forward(hidden_states):
        if layer.config.use_fused_rms_norm:
            return type(layer).forward(layer, hidden_states)
        x = hidden_states.astype("float32")
        scale = paddle.rsqrt(paddle.square(x).mean(-1, keepdim=True) + layer.variance_epsilon)
        x = scale.expand(x.shape) * x
        if layer.weight.dtype in (paddle.float16, paddle.bfloat16):
            x = paddle.cast(x, layer.weight.dtype)
        return x * layer.weight.expand(x.shape)

    return forward


def _rotary(original: Callable, rotate_half: Callable) -> Callable:
    def apply_rotary_pos_emb(q, k, cos, sin, position_ids):
        if position_ids is None:
            return original(q, k, cos, sin, position_ids)
        cos = cos.squeeze(axis=[0, 2])[position_ids].unsqueeze(2)  # [rows, tokens, 1, dim]
        sin = sin.squeeze(axis=[0, 2])[position_ids].unsqueeze(2)
        out = []
        for x in (q, k):  # k has fewer heads than q with grouped-query attention
            out.append(x * cos.expand(x.shape) + rotate_half(x) * sin.expand(x.shape))
        return tuple(out)

    apply_rotary_pos_emb.original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def _fast_paths(model) -> None:
    """The fast paths into a PaddleNLP causal LM loaded for inference: its attention, RMSNorm
    and (for the whole module of its architecture: the function is the module's) rotary
    embedding."""
    import sys

    for layer in model.sublayers():
        if callable(getattr(layer, "attn_func", None)):
            layer.attn_func = _einsum_attention(layer.attn_func)
        if type(layer).__name__ in RMS_NORMS:
            layer.forward = _rms_norm(layer)
    if type(model).__module__ in ROTARY_MODULES:
        module: Any = sys.modules[type(model).__module__]
        if not hasattr(module.apply_rotary_pos_emb, "original"):
            module.apply_rotary_pos_emb = _rotary(module.apply_rotary_pos_emb, module.rotate_half)


class PaddleLM:
    """A PaddleNLP causal LM (or a LoRA-wrapped one, in training) as the engine runs it."""

    def __init__(self, model) -> None:
        import paddle

        self.paddle = paddle
        self.model = model
        self.adapters: Adapters | None = None
        self.model.eval()

    @classmethod
    def load(cls, export_dir: Path, device: str) -> "PaddleLM":
        import paddle
        from paddlenlp.transformers import AutoModelForCausalLM
        from paddlenlp.utils.log import logger

        logger.set_level("WARNING")
        paddle.set_device("gpu:0" if device.startswith("gpu") else "cpu")
        refuse_pickles(export_dir)
        # Safetensors only: a pickled model_state.pdparams is never loaded (it could run code).
        model = AutoModelForCausalLM.from_pretrained(
            str(export_dir), dtype="float32", use_safetensors=True
        )
        _fast_paths(model)
        return cls(model)

    def forward(self, ids, mask, positions, cache):
        paddle = self.paddle
        with paddle.no_grad():
            out = self.model(
                input_ids=paddle.to_tensor(ids),
                attention_mask=paddle.to_tensor(mask),
                position_ids=paddle.to_tensor(positions),
                past_key_values=cache,
                use_cache=True,
                return_dict=True,
            )
        return out.logits[:, -1].astype("float32").numpy(), out.past_key_values

    # PaddleNLP's cache: per layer (key, value), [rows, columns, heads, dim].
    def select(self, cache, rows: list[int]):
        index = self.paddle.to_tensor(rows, dtype="int64")
        return tuple(tuple(self.paddle.index_select(t, index, axis=0) for t in kv) for kv in cache)

    def trim(self, cache, columns: int):
        return tuple(tuple(t[:, columns:] for t in kv) for kv in cache)

    def write(self, cache, slots: list[int], other, pad: int) -> None:
        """The rows of ``other`` into rows ``slots`` of ``cache``, in place, left-padded by
        ``pad`` columns (one scatter a tensor: a row at a time cost eight times as much)."""
        paddle = self.paddle
        index = paddle.to_tensor(slots, dtype="int64")
        for kv, other_kv in zip(cache, other, strict=True):
            for t, o in zip(kv, other_kv, strict=True):
                if pad:
                    zeros = paddle.zeros([o.shape[0], pad, *o.shape[2:]], o.dtype)
                    o = paddle.concat([zeros, o], 1)
                paddle.scatter_(t, index, o, overwrite=True)

    def join(self, cache, pad: int, other, other_pad: int):
        paddle = self.paddle

        def padded(t, n):  # n columns of zeros before the first (axis 1)
            if not n:
                return t
            return paddle.concat([paddle.zeros([t.shape[0], n, *t.shape[2:]], t.dtype), t], 1)

        return tuple(
            tuple(
                paddle.concat([padded(a, pad), padded(b, other_pad)])
                for a, b in zip(x, y, strict=True)
            )
            for x, y in zip(cache, other, strict=True)
        )
