"""A key/value cache the engine owns, for PaddleNLP's LLaMA and Qwen2 attention in inference.

PaddleNLP keeps a layer's cache as ``[rows, columns, heads, dim]`` and grows it by a concat at
every decoding step (a copy of the whole cache per layer), then attends over it with one small
product per row and head. Here each attention layer of a served or evaluated export writes its
new keys and values into a buffer laid out ``[rows, kv heads, capacity, dim]``, grown by
doubling, and attends with two batched matrix products over the whole buffer (the columns past
the cache's length masked): a decoding step costs about the same whatever the cache's width,
which is what continuous batching keeps wide. The arithmetic is PaddleNLP's (its projections,
rotary embedding and output layer are called as they are, so LoRA adapters' hooks still apply);
``tests/runtime/test_generation.py`` checks the logits against PaddleNLP's own.

``owns(model)`` says whether every attention layer is one this module can run (a plain
configuration: no parallelism, fused rotary, alibi or flash attention);
``install(model)`` replaces their forward; the ``Cache`` then travels where PaddleNLP's tuple
did (``past_key_values``), and the engine's batch operations (``select``, ``trim``, ``write``,
``join``) have their counterparts here.
"""

import math
import sys
from collections.abc import Sequence

import paddle
import paddle.nn.functional as F

OWNED = ("LlamaAttention", "Qwen2Attention")
GROWTH = 64  # capacity is a multiple of this many columns


def _plain(layer) -> bool:
    config = layer.config
    return (
        type(layer).__name__ in OWNED
        and not getattr(layer, "sequence_parallel", False)
        and getattr(layer, "reshard_layer", None) is None
        and not getattr(layer, "use_fused_rope", False)
        and getattr(layer, "kv_indices", None) is None
        and getattr(config, "rope", True)
        and not getattr(config, "alibi", False)
        and not getattr(config, "use_flash_attention", False)
        and not getattr(config, "use_long_sequence_strategies", False)
        and getattr(config, "context_parallel_degree", 1) <= 1
    )


def _attention_layers(model) -> list:
    return [layer for layer in model.sublayers() if hasattr(layer, "attn_func")]


def owns(model) -> bool:
    """Whether every attention layer of ``model`` is one this cache runs."""
    layers = _attention_layers(model)
    return bool(layers) and all(_plain(layer) for layer in layers)


class _Shape:
    """What PaddleNLP's model reads of a layer's cache: ``cache[0].shape[1]``, its length."""

    def __init__(self, shape: list[int]) -> None:
        self.shape = shape


class Cache:
    """One layer's keys and values: ``[rows, kv heads, capacity, dim]`` each, the first
    ``length`` columns written."""

    def __init__(self, key: paddle.Tensor, value: paddle.Tensor, length: int) -> None:
        self.key, self.value, self.length = key, value, length

    @classmethod
    def empty(cls, rows: int, heads: int, dim: int, columns: int, dtype) -> "Cache":
        capacity = max(GROWTH, -(-columns // GROWTH) * GROWTH)
        return cls(
            paddle.zeros([rows, heads, capacity, dim], dtype),
            paddle.zeros([rows, heads, capacity, dim], dtype),
            0,
        )

    def __getitem__(self, i: int) -> _Shape:
        rows, heads, _capacity, dim = self.key.shape
        return _Shape([rows, self.length, heads, dim])

    def _like(self, rows: int, columns: int) -> "Cache":
        _rows, heads, _capacity, dim = self.key.shape
        return Cache.empty(rows, heads, dim, columns, self.key.dtype)

    def append(self, key: paddle.Tensor, value: paddle.Tensor) -> None:
        """New columns (``[rows, kv heads, columns, dim]``) after the last, growing the
        buffers by doubling when they are full."""
        end = self.length + key.shape[2]
        if end > self.key.shape[2]:
            grown = self._like(self.key.shape[0], max(end, 2 * self.key.shape[2]))
            grown.key[:, :, : self.length] = self.key[:, :, : self.length]
            grown.value[:, :, : self.length] = self.value[:, :, : self.length]
            self.key, self.value = grown.key, grown.value
        self.key[:, :, self.length : end] = key
        self.value[:, :, self.length : end] = value
        self.length = end


def select(cache: Sequence[Cache], rows: list[int]) -> tuple[Cache, ...]:
    index = paddle.to_tensor(rows, dtype="int64")
    return tuple(
        Cache(
            paddle.index_select(c.key, index, axis=0),
            paddle.index_select(c.value, index, axis=0),
            c.length,
        )
        for c in cache
    )


def trim(cache: Sequence[Cache], columns: int) -> tuple[Cache, ...]:
    """Without the first ``columns`` columns."""
    out = []
    for c in cache:
        kept = c.length - columns
        new = c._like(c.key.shape[0], kept)
        new.key[:, :, :kept] = c.key[:, :, columns : c.length]
        new.value[:, :, :kept] = c.value[:, :, columns : c.length]
        new.length = kept
        out.append(new)
    return tuple(out)


def write(cache: Sequence[Cache], slot: int, other: Sequence[Cache], row: int, pad: int) -> None:
    """Row ``row`` of ``other`` into row ``slot`` of ``cache``, in place, after ``pad`` columns
    of zeros (``pad`` + ``other``'s length is ``cache``'s length)."""
    for c, o in zip(cache, other, strict=True):
        for mine, theirs in ((c.key, o.key), (c.value, o.value)):
            if pad:
                mine[slot, :, :pad] = 0
            mine[slot, :, pad : c.length] = theirs[row, :, : o.length]


def join(cache: Sequence[Cache], pad: int, other: Sequence[Cache], other_pad: int):
    """The rows of ``cache`` then those of ``other``, each left-padded by its columns of
    zeros to one length."""
    out = []
    for a, b in zip(cache, other, strict=True):
        length = pad + a.length
        rows = a.key.shape[0]
        new = a._like(rows + b.key.shape[0], length)
        for mine, x, y in ((new.key, a.key, b.key), (new.value, a.value, b.value)):
            mine[:rows, :, pad:length] = x[:, :, : a.length]
            mine[rows:, :, other_pad:length] = y[:, :, : b.length]
        new.length = length
        out.append(new)
    return tuple(out)


def _forward(layer, apply_rotary):
    """``layer``'s forward (LLaMA's or Qwen2's signature) on a ``Cache``."""
    heads, kv_heads, dim = layer.num_heads, layer.num_key_value_heads, layer.head_dim
    groups = heads // kv_heads
    scale = 1 / math.sqrt(dim)

    def forward(
        hidden_states,
        position_ids=None,
        past_key_value=None,
        attention_mask=None,
        output_attentions=False,
        use_cache=False,
        *args,
        **kwargs,
    ):
        if attention_mask is None or output_attentions:
            raise ValueError("the engine's cache needs an attention mask and no attention output")
        rows, length, _ = hidden_states.shape
        if layer.fuse_attention_qkv:  # [q of the group, k, v] per kv head, as PaddleNLP lays it
            mixed = layer.qkv_proj(hidden_states).reshape([rows, length, kv_heads, -1])
            query, key, value = paddle.split(mixed, [groups * dim, dim, dim], axis=-1)
            query = query.reshape([rows, length, heads, dim])
        else:
            query = layer.q_proj(hidden_states).reshape([rows, length, heads, dim])
            key = layer.k_proj(hidden_states).reshape([rows, length, kv_heads, dim])
            value = layer.v_proj(hidden_states).reshape([rows, length, kv_heads, dim])
        cache = past_key_value
        if cache is None:
            cache = Cache.empty(rows, kv_heads, dim, length, key.dtype)
        total = cache.length + length
        cos, sin = layer.rotary_emb(value, seq_len=total)
        query, key = apply_rotary(query, key, cos, sin, position_ids)
        cache.append(key.transpose([0, 2, 1, 3]), value.transpose([0, 2, 1, 3]))
        capacity = cache.key.shape[2]
        # [rows, heads, length, dim] → [rows, kv heads, groups × length, dim]: one product per
        # kv head serves the query heads that share it.
        query = (query * scale).transpose([0, 2, 1, 3]).reshape([rows, kv_heads, -1, dim])
        scores = paddle.matmul(query, cache.key, transpose_y=True)
        mask = attention_mask.astype(scores.dtype).reshape([rows, 1, 1, length, total])
        if capacity > total:  # the columns not written yet
            far = paddle.full([rows, 1, 1, length, capacity - total], -1e30, scores.dtype)
            mask = paddle.concat([mask, far], axis=-1)
        scores = scores.reshape([rows, kv_heads, groups, length, capacity]) + mask
        weights = F.softmax(scores, axis=-1).reshape([rows, kv_heads, -1, capacity])
        out = paddle.matmul(weights, cache.value)  # [rows, kv heads, groups × length, dim]
        out = out.reshape([rows, heads, length, dim]).transpose([0, 2, 1, 3])
        out = layer.o_proj(out.reshape([rows, length, heads * dim]))
        return (out, cache) if use_cache else out

    return forward


def install(model) -> None:
    """Run every attention layer of ``model`` (``owns(model)``) on a ``Cache``."""
    for layer in _attention_layers(model):
        apply_rotary = sys.modules[type(layer).__module__].apply_rotary_pos_emb
        layer.forward = _forward(layer, apply_rotary)
