"""What a causal LM is (parameters, context length) from its config.json, and an estimate of
the device memory its fine-tuning needs, per device type.

The estimate adds weights, gradients and AdamW's two moments of what is trained, the
activations kept for the backward pass, and the logits:

- weights in bfloat16/float16 where the device's profile has mixed precision, else float32;
  full fine-tuning keeps a float32 master copy (16 bytes a parameter with mixed precision);
- activations: about 34·s·h bytes per layer and sequence in half precision plus the attention
  scores 5·a·s² (Korthikanti et al., 2022), or only each layer's input with recomputation;
- logits and their log-softmax in float32: 8·s·V bytes per sequence.

It is an estimate, within tens of percent: frameworks add workspace and fragmentation.
"""

from dataclasses import dataclass
from typing import Protocol


class DeviceProfile(Protocol):
    """What the estimate reads of a device type's profile (console.hardware.DeviceProfile)."""

    name: str
    label: str
    amp: bool


def causal_lm_summary(config: dict) -> dict:
    """Layers, sizes, parameters and context length of a LLaMA-like decoder's config."""
    h = int(config.get("hidden_size") or config.get("n_embd") or 0)
    layers = int(config.get("num_hidden_layers") or config.get("num_layers") or 0)
    heads = int(config.get("num_attention_heads") or 0)
    kv_heads = int(config.get("num_key_value_heads") or heads or 0)
    inter = int(config.get("intermediate_size") or config.get("ffn_hidden_size") or 4 * h)
    vocab = int(config.get("vocab_size") or 0)
    head_dim = int(config.get("head_dim") or (h // heads if heads else 0))
    attention = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2
    mlp = 3 * h * inter
    embeddings = vocab * h * (1 if config.get("tie_word_embeddings") else 2)
    parameters = layers * (attention + mlp + 2 * h) + embeddings + h
    context = (
        config.get("max_position_embeddings")
        or config.get("seq_length")
        or config.get("max_sequence_length")
    )
    return {
        "causal_lm": True,
        "layers": layers,
        "hidden_size": h,
        "heads": heads,
        "kv_heads": kv_heads,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "parameters": parameters,
        "context_length": context,
        # Adapters of rank 1 on the attention and MLP projections (LoRA's default targets).
        "lora_parameters_per_rank": layers * (4 * h + 2 * kv_heads * head_dim + 3 * (h + inter)),
    }


@dataclass(frozen=True)
class MemoryEstimate:
    device: str
    method: str
    weights: int
    training_state: int
    activations: int
    total: int


def fine_tune_memory(
    summary: dict,
    device: DeviceProfile,
    *,
    method: str,
    batch_size: int,
    seq_length: int,
    lora_rank: int = 8,
    recompute: bool = False,
) -> MemoryEstimate:
    p = summary["parameters"]
    half = device.amp
    w = 2 if half else 4
    if method == "full":
        trained = p
        weights = w * p
        state = trained * (16 if half else 12)  # fp32 master (mixed), gradient, two moments
    else:
        trained = summary["lora_parameters_per_rank"] * lora_rank
        weights = w * p + 4 * trained
        state = trained * 12
    b, s = batch_size, seq_length
    h, layers, heads = summary["hidden_size"], summary["layers"], summary["heads"] or 1
    if recompute:
        per_layer = b * s * h * w
    else:
        per_layer = b * s * (34 * h + 5 * heads * s) * w // 2
    activations = layers * per_layer + 8 * b * s * summary["vocab_size"]
    total = int((weights + state + activations) * 1.1)  # workspace and fragmentation
    return MemoryEstimate(device.name, method, weights, state, activations, total)


def estimates(summary: dict, devices, *, batch_size: int, seq_length: int) -> list[dict]:
    """LoRA and full fine-tuning on each device type, for the base-model page."""
    rows = []
    for device in devices:
        row = {"device": device.label, "name": device.name}
        for method in ("lora", "full"):
            row[method] = fine_tune_memory(
                summary, device, method=method, batch_size=batch_size, seq_length=seq_length
            ).total
        rows.append(row)
    return rows
