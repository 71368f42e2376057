"""Fine-tuning of causal LMs, as every backend does it: SFT on conversations (the loss on the
assistant's tokens only) and DPO on preference pairs, with LoRA or all weights, gradient
accumulation, checkpoints and resuming, the dev loss each epoch, the best weights, and an
evaluation on held-out rows (loss, perplexity or preference accuracy, and generations beside
their references with a character-level ROUGE-L). A backend supplies an ``LLMOps``: how its
framework builds, steps, scores, generates, saves and exports a causal LM.

DPO's reference model is the model before training: the log-probabilities it gives every pair
are computed once, before the first step, and kept with the checkpoint, so LoRA and full
fine-tuning need no second copy of the model in memory.
"""

import math
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from runtime import data
from runtime.backends import Emit
from runtime.chat import ChatTokenizer, SftExample, build_char_tokenizer, encode_row, pack
from runtime.loop import BEST, Budget, Progress, recovered_checkpoint, resume_state
from runtime.metrics import rouge_l
from runtime.spec import JobSpec

TOKENIZER = "tokenizer"  # where a preset's character tokenizer is kept in the work directory
REFERENCE = "reference_logps.npy"

# Linear layers that get LoRA adapters, per architecture (config.json's model_type).
LORA_TARGETS = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "qwen2": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "mistral": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "ernie4_5": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "chatglm": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
    "bloom": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
    "glm4": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"),
}
# The architectures tested end to end here (a tiny random model of each, with its chat models'
# own template and special tokens, rendered as transformers renders them: LoRA SFT, DPO, the
# merged export, generation, its LoRA adapters served over one model), by backend:
# tests/runtime/test_architectures.py (LLaMA also through the platform). The base-models page
# shows it.
TESTED = {
    "llama": ("paddle", "torch"),
    "qwen2": ("paddle", "torch"),
    "mistral": ("paddle",),
    "ernie4_5": ("torch",),
    "glm4": ("torch",),
}


class LLMOps(Protocol):
    world: int
    rank: int

    def build(self, spec: JobSpec, tokenizer: ChatTokenizer) -> None:
        """The causal LM (the base model's weights or the preset's config), adapters when the
        method is LoRA, and the optimizer of the trained weights."""

    def backward(self, batch: dict[str, np.ndarray], objective: str, scale: float) -> dict:
        """Forward and backward of one micro-batch; returns its loss (and DPO's figures)."""

    def update(self, lr: float) -> None:
        """One optimizer step with the gradients accumulated since the last."""

    def token_logps(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Per sequence: the sum of log p of its labelled tokens, and their count ([B, 2])."""

    def inference_lm(self):
        """The model in evaluation mode for ``runtime.generation``: ``forward(ids, mask,
        positions, cache) → (last logits, cache)``."""

    def save(self, directory: Path, with_optimizer: bool) -> None: ...

    def load(self, directory: Path, with_optimizer: bool) -> None: ...

    def export(self, directory: Path) -> dict:
        """The model for serving: LoRA merged into the base weights, and its config."""

    def peak_memory_mb(self) -> float | None: ...


def lora_targets(spec: JobSpec, model_type: str) -> list[str]:
    if spec.hp.lora_target_modules:
        return list(spec.hp.lora_target_modules)
    return list(LORA_TARGETS.get(model_type, LORA_TARGETS["llama"]))


def tokenizer_for(spec: JobSpec, workdir: Path, rows: list[dict]) -> ChatTokenizer:
    """The base model's tokenizer, or (preset) one made from the training rows' characters."""
    if spec.base_model_dir:
        return ChatTokenizer(Path(spec.base_model_dir))
    kept = workdir / TOKENIZER
    if (kept / "tokenizer.json").exists():  # resuming: the vocabulary trained with
        return ChatTokenizer(kept)
    return build_char_tokenizer((t for row in rows for t in texts_of(row)), kept)


def texts_of(row: dict) -> list[str]:
    if "messages" in row:
        return [t["content"] for t in row["messages"]] + [t["role"] for t in row["messages"]]
    return [row["prompt"], row["chosen"], row["rejected"], "user", "assistant"]


def encode_rows(spec: JobSpec, tok: ChatTokenizer, rows: list[dict], split: str, emit: Emit):
    """Examples of the rows that fit ``max_seq_length``; those that do not are reported by
    split and row, and left out."""
    limit = spec.hp.max_seq_length
    examples, too_long = [], []
    for number, row in enumerate(rows, start=1):
        ex, length = encode_row(spec.task_kind, tok, row)
        if length > limit:
            too_long.append({"row": number, "tokens": length})
            continue
        examples.append(ex)
    if too_long:
        emit(
            "log",
            message=f"{split}: {len(too_long)} row(s) over the token limit of {limit} left out: "
            + ", ".join(f"row {t['row']} ({t['tokens']} tokens)" for t in too_long[:20]),
            too_long=too_long[:200],
            split=split,
        )
    return examples


def collate_sft(examples, pad_id: int) -> dict[str, np.ndarray]:
    width = max(len(e.input_ids) for e in examples)
    ids = np.full((len(examples), width), pad_id, dtype="int64")
    labels = np.full((len(examples), width), data.IGNORE, dtype="int64")
    mask = np.zeros((len(examples), width), dtype="int64")
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n], labels[i, :n], mask[i, :n] = e.input_ids, e.labels, 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def collate_dpo(examples, pad_id: int) -> dict[str, np.ndarray]:
    """Chosen sequences first, then rejected ones, with the loss on the responses only."""
    seqs = [(e.prompt, e.chosen) for e in examples] + [(e.prompt, e.rejected) for e in examples]
    return collate_sft([SftExample(p + r, [data.IGNORE] * len(p) + r) for p, r in seqs], pad_id)


def dpo_margin(policy: Any, reference: Any, beta: float) -> Any:
    """DPO's margin from summed log-probs [2B] (chosen, then rejected) of the policy and the
    reference: beta × how much more the policy prefers each chosen response than the reference
    does. Arrays of numpy, paddle or torch alike."""
    n = policy.shape[0] // 2
    return beta * ((policy[:n] - reference[:n]) - (policy[n:] - reference[n:]))


def backward_scaled(loss: Any, scale: float, scaler: Any) -> None:
    """Backpropagate ``loss × scale`` (a step's share of gradient accumulation), through the
    mixed-precision loss scaler where there is one (paddle's and torch's alike)."""
    scaled = loss * scale
    if scaler is not None:
        scaler.scale(scaled).backward()
    else:
        scaled.backward()


def dpo_loss_np(policy: np.ndarray, reference: np.ndarray, beta: float) -> dict:
    """DPO's loss, reward accuracy and margin from summed log-probs [2B] (chosen, rejected)."""
    margin = dpo_margin(policy, reference, beta)
    loss = np.logaddexp(0, -margin).mean()  # -log sigmoid(margin)
    return {
        "loss": float(loss),
        "accuracy": float((margin > 0).mean()),
        "margin": float(margin.mean()),
    }


def fit(spec: JobSpec, workdir: Path, emit: Emit, ops: LLMOps) -> dict:
    """Train, then evaluate the best weights on the test split (dev without one)."""
    hp = spec.hp
    objective = data.OBJECTIVES[spec.task_kind]
    started = time.perf_counter()
    rows = {
        s: load_rows(workdir, s, spec.task_kind, hp.min_rating) for s in ("train", "dev", "test")
    }
    if not rows["train"]:
        raise ValueError("the dataset version has no answered rows in its train split")
    tok = tokenizer_for(spec, workdir, rows["train"])
    examples = {s: encode_rows(spec, tok, r, s, emit) for s, r in rows.items()}
    train = examples["train"]
    if not train:
        raise ValueError(
            f"every training row is over the token limit of {hp.max_seq_length}; raise "
            "max_seq_length"
        )
    if objective == "sft" and hp.packing:
        train = pack(train, hp.max_seq_length)
    accum = max(1, hp.gradient_accumulation_steps)
    micro = data.steps_per_epoch(len(train), hp.batch_size)
    per_epoch = max(1, micro // accum)
    total = per_epoch * hp.epochs
    emit(
        "log",
        message=f"{len(rows['train'])} training rows ({len(train)} sequences), "
        f"{len(rows['dev'])} dev rows, {tok.vocab_size} tokens in the vocabulary, "
        f"{total} steps of {hp.batch_size * accum} sequences, objective {objective}, "
        f"method {hp.method}",
    )
    checkpoint = recovered_checkpoint(workdir)
    ops.build(spec, tok)
    state = resume_state(ops, checkpoint, emit)
    budget = Budget(
        spec,
        state,
        emit,
        per_epoch=per_epoch,
        total=total,
        test_share=len(examples["test"]) / len(examples["dev"]) if examples["dev"] else 0.0,
        started=started,
    )

    reference = {}
    if objective == "dpo":
        reference = _reference_logps(ops, tok, examples, checkpoint, hp.batch_size)

    def save_reference(tmp: Path) -> None:
        if reference:
            np.save(tmp / REFERENCE, reference["train"])

    def probe() -> float:
        """The loss of a few dev examples, scaled to the split."""
        t0 = time.perf_counter()
        dev = examples["dev"]
        sample = dev[: hp.batch_size * 2]
        if sample:
            ref = reference.get("dev")
            ref = None if ref is None else ref[: len(sample)]
            _loss_metrics(ops, objective, sample, ref, tok, hp)
        return (time.perf_counter() - t0) * len(dev) / max(1, len(sample))

    def dev_loss() -> tuple[dict[str, Any], float]:
        metrics = _loss_metrics(ops, objective, examples["dev"], reference.get("dev"), tok, hp)
        return metrics, -metrics["loss"]  # lower loss is better

    progress = Progress(
        spec,
        state,
        emit,
        budget,
        ops=ops,
        workdir=workdir,
        per_step=hp.batch_size * accum,
        probe=probe,
        checkpoint_files=save_reference,
    )
    emit("state", phase="training", build_s=round(time.perf_counter() - started, 3))
    collate = collate_sft if objective == "sft" else collate_dpo
    order = list(range(len(train)))
    for epoch, skip in progress.epochs():
        rng = np.random.default_rng(hp.seed + epoch)
        shuffled = [order[i] for i in rng.permutation(len(order))]
        groups = [shuffled[i : i + hp.batch_size] for i in range(0, len(shuffled), hp.batch_size)][
            : per_epoch * accum
        ]
        for s in range(per_epoch):
            if s < skip:
                continue
            if state["step"] >= budget.total:
                break
            lr = progress.begin_step()
            figures: dict[str, float] = {}
            samples = 0
            for group in groups[s * accum : (s + 1) * accum]:
                batch = collate([train[i] for i in group], tok.pad_id)
                if objective == "dpo":
                    batch["reference"] = np.concatenate(
                        [reference["train"][group, 0], reference["train"][group, 1]]
                    )
                out = ops.backward(batch, objective, 1.0 / accum)
                for k, v in out.items():
                    figures[k] = figures.get(k, 0.0) + v / accum
                samples += len(group)
            ops.update(lr)
            progress.end_step(figures["loss"], samples, last_of_epoch=s == per_epoch - 1)
        progress.end_epoch(
            dev_loss if examples["dev"] else None, what="the dev loss", show_best=False
        )
    progress.finish(total)
    state["peak_memory_mb"] = ops.peak_memory_mb()

    emit("state", phase="evaluating")
    ops.load(workdir / BEST, with_optimizer=False)
    split = "test" if rows["test"] else "dev"
    state["evaluation"] = evaluate(
        ops, spec, tok, rows[split], examples[split], reference.get(split), split
    )
    return state


def load_rows(workdir: Path, split: str, task_kind: str, min_rating: int = 0) -> list[dict]:
    """The split's answered rows, without those rated below ``min_rating``."""
    path = workdir / "data" / f"{split}.jsonl"
    if not path.exists():
        return []
    return [
        r
        for r in data.read_rows(path)
        if data.is_labeled(task_kind, r) and (r.get("rating") or min_rating) >= min_rating
    ]


def _reference_logps(ops, tok, examples, checkpoint: Path, batch_size: int) -> dict:
    """The reference model's summed log-probs of each pair's chosen and rejected responses,
    per split: [rows, 2]. Kept with the checkpoint: a resumed job's model has moved on."""
    found = {}
    kept = checkpoint / REFERENCE
    for split, items in examples.items():
        if not items:
            continue
        if split == "train" and kept.exists():
            found[split] = np.load(kept)
            continue
        found[split] = _pair_logps(ops, items, tok.pad_id, batch_size)
    return found


def _pair_logps(ops, items, pad_id: int, batch_size: int) -> np.ndarray:
    out = np.zeros((len(items), 2), dtype="float64")
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        scored = ops.token_logps(collate_dpo(chunk, pad_id))[:, 0]
        out[start : start + len(chunk), 0] = scored[: len(chunk)]
        out[start : start + len(chunk), 1] = scored[len(chunk) :]
    return out


def _loss_metrics(ops, objective, items, reference, tok, hp) -> dict:
    """SFT: the mean loss per response token and its perplexity; DPO: the loss, how often the
    chosen response has the higher reward (accuracy), and the mean reward margin."""
    if objective == "sft":
        total = count = 0.0
        for start in range(0, len(items), hp.batch_size):
            scored = ops.token_logps(collate_sft(items[start : start + hp.batch_size], tok.pad_id))
            total -= scored[:, 0].sum()
            count += scored[:, 1].sum()
        loss = total / max(count, 1)
        return {"loss": round(float(loss), 6), "perplexity": round(math.exp(min(loss, 50)), 4)}
    policy = _pair_logps(ops, items, tok.pad_id, hp.batch_size)
    figures = dpo_loss_np(
        np.concatenate([policy[:, 0], policy[:, 1]]),
        np.concatenate([reference[:, 0], reference[:, 1]]),
        hp.dpo_beta,
    )
    return {k: round(v, 6) for k, v in figures.items()}


def evaluate(ops, spec, tok, rows, items, reference, split) -> dict:
    """The held-out split's loss figures, and generations for its first prompts beside the
    references with their character-level ROUGE-L."""
    hp = spec.hp
    objective = data.OBJECTIVES[spec.task_kind]
    metrics = _loss_metrics(ops, objective, items, reference, tok, hp) if items else {}
    samples = []
    for row in rows[: hp.eval_generations]:
        if "messages" in row:
            prompt, reference_text = row["messages"][:-1], row["messages"][-1]["content"]
        else:
            prompt, reference_text = [{"role": "user", "content": row["prompt"]}], row["chosen"]
        samples.append((prompt, reference_text))
    # Prompts longer than the training length are left out, as their rows were.
    prompts = [tok.prompt_ids(p) for p, _ in samples]
    kept = [i for i, ids in enumerate(prompts) if len(ids) < hp.max_seq_length]
    generations = []
    if kept:
        from runtime.generation import GenerationRequest, generate

        started = time.perf_counter()
        requests = [
            GenerationRequest(prompts[i], max_tokens=hp.max_new_tokens, temperature=0) for i in kept
        ]
        texts = generate(ops.inference_lm(), tok, requests)
        elapsed = time.perf_counter() - started
        new_tokens = sum(len(tok.encode(t)) for t in texts)
        for i, text in zip(kept, texts, strict=True):
            prompt, reference_text = samples[i]
            generations.append(
                {
                    "prompt": prompt,
                    "reference": reference_text,
                    "generated": text,
                    "rouge_l": round(rouge_l(text, reference_text), 4),
                }
            )
        metrics["rouge_l"] = round(sum(g["rouge_l"] for g in generations) / len(generations), 4)
        metrics["generation_tokens_per_s"] = round(new_tokens / elapsed, 1) if elapsed else None
    return {"split": split, "rows": len(rows), "metrics": metrics, "generations": generations}


def export(spec: JobSpec, workdir: Path, out_dir: Path, ops: LLMOps) -> dict:
    """The trained model merged for serving, with its tokenizer and chat template."""
    from runtime.chat import copy_tokenizer

    ops.load(workdir / BEST, with_optimizer=False)
    files = ops.export(out_dir)
    source = Path(spec.base_model_dir) if spec.base_model_dir else workdir / TOKENIZER
    copy_tokenizer(source, out_dir)
    return files
