"""Domain-adaptive pretraining: masked language modelling on a dataset's texts (objective
``"mlm"``), labeled or not, so that a site without downloaded weights still gets an encoder
pretrained on its own text, which later jobs fine-tune like any imported base model.

The texts of every split (``text``; ``text_a``/``text_b`` of a pair, read as a pair) are cut
into windows of ``max_seq_length - 2`` characters; a share of them (``HELD_OUT``, at least one)
is held out. The vocabulary is the base model's ``vocab.txt`` (continuing an imported ERNIE or
an earlier pretraining's result) or, for a preset, one made from all the texts. Each step masks
``mlm_probability`` of a window's characters as BERT does (80% ``[MASK]``, 10% a random
character, 10% unchanged; at least one a window), drawn again every epoch from ``seed + epoch``
so that a resumed job masks its batches as the first attempt did. The held-out windows are
masked once, the same way at every evaluation, so their loss is comparable from epoch to epoch:
it picks the best weights and drives early stopping.

``best/`` is the result: the encoder with its MLM head in the backend's layout (safetensors,
``config.json``, ``vocab.txt``, ``tokenizer_config.json``), what a base-model import accepts.
The evaluation is the held-out loss, its perplexity and the masked-token accuracy of the best
weights, beside those of the model before training.
"""

import math
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from runtime import data
from runtime.backends import Emit
from runtime.loop import (
    BEST,
    CHECKPOINT,
    VOCAB,
    Budget,
    Progress,
    recovered_checkpoint,
    resume_state,
)
from runtime.spec import JobSpec
from runtime.tokenizer import MASK, SPECIAL_TOKENS, CharTokenizer, Encoded

MLM = "mlm"
# The share of the windows held out for the evaluation, and at most this many of them.
HELD_OUT, MAX_HELD_OUT = 0.1, 2000
TOKENIZER_CONFIG = {"tokenizer_class": "ErnieTokenizer", "do_lower_case": True}
# Recommended hyperparameters: from scratch (a preset) a larger rate and more epochs; an
# imported encoder continues at a fine-tuning's rate.
RECOMMENDED = {
    "preset": {"learning_rate": 1e-3, "epochs": 20, "batch_size": 32, "max_seq_length": 128},
    "base": {"learning_rate": 5e-5, "epochs": 5, "batch_size": 32, "max_seq_length": 128},
}


class MLMOps(Protocol):
    def build(self, spec: JobSpec, vocab_size: int) -> None:
        """An encoder with an MLM head from ``spec.base_model_dir`` or the preset's config, and
        its optimizer."""

    def train_step(self, batch: dict[str, np.ndarray], lr: float) -> float: ...

    def evaluate(self, batch: dict[str, np.ndarray]) -> tuple[float, int, int]:
        """The summed loss over the masked tokens of ``batch``, their number, and how many the
        model predicted right."""

    def save(self, directory: Path, with_optimizer: bool) -> None: ...

    def load(self, directory: Path, with_optimizer: bool) -> None: ...


def texts(workdir: Path, task_kind: str) -> list[tuple[str, str | None]]:
    """The texts of every split, labeled or not: (text, second text of a pair or None)."""
    out: list[tuple[str, str | None]] = []
    for split in ("train", "dev", "test"):
        path = workdir / "data" / f"{split}.jsonl"
        if not path.exists():
            continue
        for row in data.read_rows(path):
            try:
                text, text_b = data.row_inputs(task_kind, row)
            except (KeyError, TypeError, ValueError):
                continue  # a row without its text
            if text or text_b:
                out.append((text or "", text_b))
    return out


def windows(
    tokenizer: CharTokenizer, items: list[tuple[str, str | None]], max_length: int
) -> list[Encoded]:
    """Every text in windows of ``max_length - 2`` characters, side by side (each character
    is read once); a pair as one sequence, cut as a pair job cuts it."""
    size = max(1, max_length - 2)
    out = []
    for text, text_b in items:
        if text_b is not None:
            out.append(tokenizer.encode(text, text_b, max_length))
            continue
        for start in range(0, len(text), size):
            out.append(tokenizer.encode(text[start : start + size], None, max_length))
    return out


def mask_batch(
    encs: list[Encoded], tokenizer: CharTokenizer, probability: float, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """A padded batch with BERT's masking: ``probability`` of each window's characters (at
    least one) are predicted; of those, 80% become [MASK], 10% a random character and 10% stay.
    ``labels`` hold the original ids there and IGNORE elsewhere."""
    feed = data.collate([data.Example(e, None) for e in encs], tokenizer.pad_id)
    ids = feed["input_ids"]
    labels = np.full(ids.shape, data.IGNORE, dtype="int64")
    special = np.isin(ids, [tokenizer.ids[t] for t in SPECIAL_TOKENS if t in tokenizer.ids])
    first = len(SPECIAL_TOKENS)  # a random character: any but the special tokens
    for i in range(len(encs)):
        candidates = np.flatnonzero(~special[i])
        if not len(candidates):
            continue
        n = max(1, round(probability * len(candidates)))
        chosen = rng.choice(candidates, size=n, replace=False)
        labels[i, chosen] = ids[i, chosen]
        draw = rng.random(n)
        ids[i, chosen[draw < 0.8]] = tokenizer.ids[MASK]
        swap = chosen[(draw >= 0.8) & (draw < 0.9)]
        if len(swap) and len(tokenizer.vocab) > first:
            ids[i, swap] = rng.integers(first, len(tokenizer.vocab), size=len(swap))
    feed["labels"] = labels
    return feed


def _tokenizer(spec: JobSpec, workdir: Path, items: list[tuple[str, str | None]]) -> CharTokenizer:
    if spec.base_model_dir:
        tokenizer = CharTokenizer.from_file(Path(spec.base_model_dir) / VOCAB)
    elif (workdir / CHECKPOINT / VOCAB).exists():  # resuming: the checkpoint's vocabulary
        tokenizer = CharTokenizer.from_file(workdir / CHECKPOINT / VOCAB)
    else:
        tokenizer = CharTokenizer.build(t for pair in items for t in pair if t)
    if MASK not in tokenizer.ids:
        raise ValueError(f"vocab.txt lacks {MASK}: masked language modelling needs it")
    return tokenizer


def held_out_figures(ops: MLMOps, batches: list[dict[str, np.ndarray]]) -> dict[str, float | int]:
    """The held-out loss (mean over the masked tokens), its perplexity, and the masked-token
    accuracy."""
    loss, count, correct = 0.0, 0, 0
    for batch in batches:
        s, n, c = ops.evaluate(batch)
        loss, count, correct = loss + s, count + n, correct + c
    mean = loss / max(1, count)
    return {
        "mlm_loss": round(mean, 6),
        "perplexity": round(math.exp(min(mean, 50.0)), 4),
        "masked_accuracy": round(correct / max(1, count), 6),
        "masked_tokens": count,
    }


def fit(spec: JobSpec, workdir: Path, emit: Emit, ops: MLMOps) -> dict[str, Any]:
    """Pretrain; returns the final state with ``evaluation`` (the best weights' held-out
    figures, and the model's before training)."""
    hp = spec.hp
    started = time.perf_counter()
    items = texts(workdir, spec.task_kind)
    if not items:
        raise ValueError("the dataset version has no texts to pretrain on")
    tokenizer = _tokenizer(spec, workdir, items)
    encs = windows(tokenizer, items, hp.max_seq_length)
    order = np.random.default_rng(hp.seed).permutation(len(encs))
    n_held = min(MAX_HELD_OUT, max(1, int(len(encs) * HELD_OUT))) if len(encs) > 1 else 0
    held = [encs[i] for i in order[:n_held]]
    train = [data.Example(encs[i], None) for i in order[n_held:]] or [
        data.Example(e, None) for e in held
    ]
    rng = np.random.default_rng(hp.seed + 1_000_003)  # one masking of the held-out windows
    held_batches = [
        mask_batch(held[s : s + 64], tokenizer, hp.mlm_probability, rng)
        for s in range(0, len(held), 64)
    ]
    per_epoch = data.steps_per_epoch(len(train), hp.batch_size)
    total = per_epoch * hp.epochs
    emit(
        "log",
        message=f"masked language modelling on {len(items)} texts: {len(train)} windows to "
        f"train on, {len(held)} held out, {len(tokenizer.vocab)} tokens in the vocabulary, "
        f"{total} steps",
    )

    checkpoint = recovered_checkpoint(workdir)
    ops.build(spec, len(tokenizer.vocab))
    state = resume_state(ops, checkpoint, emit)
    if "initial" not in state:  # the model before training, for the report
        state["initial"] = held_out_figures(ops, held_batches) if held_batches else {}
    budget = Budget(
        spec, state, emit, per_epoch=per_epoch, total=total, test_share=0.0, started=started
    )

    def more(tmp: Path) -> None:
        import json

        tokenizer.save(tmp / VOCAB)
        (tmp / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG), "utf-8")

    def probe() -> float:
        t0 = time.perf_counter()
        held_out_figures(ops, held_batches)
        return time.perf_counter() - t0

    def held_out() -> tuple[dict[str, Any], float]:
        figures = held_out_figures(ops, held_batches)
        return figures, float(figures["mlm_loss"])

    progress = Progress(
        spec,
        state,
        emit,
        budget,
        ops=ops,
        workdir=workdir,
        per_step=hp.batch_size,
        probe=probe,
        checkpoint_files=more,
        best_files=more,
    )
    emit("state", phase="training", build_s=round(time.perf_counter() - started, 3))
    for epoch, skip in progress.epochs():
        masking = np.random.default_rng([hp.seed, epoch])
        for i, batch in enumerate(data.batches(train, hp.batch_size, shuffle_seed=hp.seed + epoch)):
            # Drawn for every batch, skipped or not: a resumed epoch masks as the first did.
            feed = mask_batch([e.enc for e in batch], tokenizer, hp.mlm_probability, masking)
            if i < skip:
                continue
            if state["step"] >= budget.total:
                break
            lr = progress.begin_step()
            loss = ops.train_step(feed, lr)
            progress.end_step(loss, len(batch), last_of_epoch=i == per_epoch - 1)
        progress.end_epoch(
            held_out if held_batches else None,
            what="the held-out MLM loss",
            lower_is_better=True,
        )
    progress.finish(total)

    emit("state", phase="evaluating")
    ops.load(workdir / BEST, with_optimizer=False)
    figures = held_out_figures(ops, held_batches) if held_batches else {}
    state["evaluation"] = {
        "objective": MLM,
        "split": "held_out",
        "rows": len(held),
        "texts": len(items),
        "windows": len(encs),
        "vocab_size": len(tokenizer.vocab),
        "metrics": figures,
        "initial": state["initial"],
    }
    return state
