"""The training loop every backend shares: epochs, shuffling, warm-up and decay of the learning
rate, checkpoints and resuming, evaluation on the dev split, the best model, early stopping and
the events the console shows. A backend supplies only a ``ModelOps``: how its framework builds,
steps, predicts, saves and loads a model.

Resume: ``checkpoint/`` holds the weights, the optimizer and ``state.json`` (epoch, step, best
metric, history). A job started again after its worker died goes on from that step: the batches
of each epoch are shuffled by ``seed + epoch``, so the skipped ones are exactly those already
trained on.
"""

import errno
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from runtime import data
from runtime.backends import Emit
from runtime.metrics import evaluate
from runtime.spec import JobSpec
from runtime.tokenizer import CharTokenizer

CHECKPOINT, BEST = "checkpoint", "best"
VOCAB = "vocab.txt"


class ModelOps(Protocol):
    def build(self, spec: JobSpec, space: data.LabelSpace, vocab_size: int) -> None:
        """A model for ``space`` from ``spec.base_model_dir`` or the preset's config, and its
        optimizer."""

    def train_step(self, batch: dict[str, np.ndarray], lr: float) -> float: ...

    def logits(self, batch: dict[str, np.ndarray]) -> np.ndarray: ...

    def save(self, directory: Path, with_optimizer: bool) -> None: ...

    def load(self, directory: Path, with_optimizer: bool) -> None: ...


def learning_rate(spec: JobSpec, step: int, total: int) -> float:
    """Linear warm-up, then linear decay to zero."""
    peak = spec.hp.learning_rate
    warmup = int(total * spec.hp.warmup_ratio)
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * max(0.0, (total - step) / max(1, total - warmup))


def load_split(workdir: Path, split: str, task_kind: str) -> list[dict]:
    path = workdir / "data" / f"{split}.jsonl"
    if not path.exists():
        return []
    return [r for r in data.read_rows(path) if data.is_labeled(task_kind, r)]


def tokenizer_for(spec: JobSpec, workdir: Path, train_rows: list[dict]) -> CharTokenizer:
    """The base model's vocabulary, or (preset) one made from the training rows."""
    if spec.base_model_dir:
        return CharTokenizer.from_file(Path(spec.base_model_dir) / VOCAB)
    kept = workdir / CHECKPOINT / VOCAB
    if kept.exists():  # resuming: the vocabulary the checkpoint was trained with
        return CharTokenizer.from_file(kept)
    texts = (t for row in train_rows for t in data.row_inputs(spec.task_kind, row) if t)
    return CharTokenizer.build(texts)


def _write_dir(target: Path, write) -> None:
    """Replace ``target`` by what ``write(tmp)`` writes: a kill never leaves half a directory."""
    tmp = target.with_name(target.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    from safetensors import SafetensorError

    try:
        tmp.mkdir(parents=True)
        write(tmp)
    except (OSError, SafetensorError) as exc:
        # A full or read-only disk: the earlier copy stays whole, and the half-written one
        # gives its space back. safetensors reports the disk's error in its own exception.
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            code, reason = exc.errno, exc.strerror
        elif "No space left" in str(exc):
            code, reason = errno.ENOSPC, os.strerror(errno.ENOSPC)
        else:
            code, reason = errno.EIO, str(exc)
        raise OSError(
            code,
            f"could not write the {target.name} in {target.parent} ({reason}); "
            f"the previous {target.name} is intact",
        ) from exc
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _recover(target: Path) -> None:
    """After a kill between the two renames of ``_write_dir``: take the complete copy."""
    for suffix in (".new", ".old"):
        other = target.with_name(target.name + suffix)
        if not (target / "state.json").exists() and (other / "state.json").exists():
            shutil.rmtree(target, ignore_errors=True)
            other.rename(target)


class _Checkpointed(Protocol):
    def save(self, directory: Path, with_optimizer: bool) -> None: ...

    def load(self, directory: Path, with_optimizer: bool) -> None: ...


def save_weights(
    ops: _Checkpointed,
    target: Path,
    state: dict[str, Any],
    *,
    with_optimizer: bool = False,
    more: Callable[[Path], None] | None = None,
) -> None:
    """Replace ``target`` by the weights of ``ops`` (and its optimizer's state), the files
    ``more`` writes, and ``state``: ``state.json`` comes last, it marks the directory whole."""

    def write(tmp: Path) -> None:
        ops.save(tmp, with_optimizer=with_optimizer)
        if more:
            more(tmp)
        (tmp / "state.json").write_text(json.dumps(state))

    _write_dir(target, write)


def resume_state(ops: _Checkpointed, checkpoint: Path, emit: Emit) -> dict[str, Any]:
    """The training loop's state: the checkpoint's, its weights and optimizer loaded into
    ``ops``, where an earlier run of the job wrote one; else a fresh start."""
    if (checkpoint / "state.json").exists():
        ops.load(checkpoint, with_optimizer=True)
        state = json.loads((checkpoint / "state.json").read_text())
        emit("resumed", step=state["step"], epoch=state["epoch"])
        return state
    return {"epoch": 0, "step": 0, "best": None, "best_step": 0, "bad_evals": 0, "history": []}


def check_finite(loss: float, step: int) -> None:
    if not math.isfinite(loss):
        raise FloatingPointError(f"the loss is {loss} at step {step}; lower the learning rate")


def step_done(
    emit: Emit,
    spec: JobSpec,
    state: dict[str, Any],
    *,
    loss: float,
    total: int,
    epoch: int,
    last_of_epoch: bool,
    samples: int,
    busy: float,
    per_step: int,
    last_report: float,
    save_checkpoint: Callable[[], None],
) -> float:
    """After an optimiser step: count it, stop on a non-finite loss, send the loss and progress
    events at most twice a second (and at the epoch's and the job's last step; ``samples``
    trained in ``busy`` seconds so far, ``per_step`` samples a step), save a checkpoint every
    ``checkpoint_steps`` within an epoch. Returns when the events were last sent."""
    state["step"] += 1
    step = state["step"]
    check_finite(loss, step)
    now = time.monotonic()
    if now - last_report >= 0.5 or step == total or last_of_epoch:
        last_report = now
        rate = samples / busy if busy else 0.0
        left = (total - step) * per_step / rate if rate else None
        emit("loss", step=step, loss=round(loss, 6), lr=learning_rate(spec, step - 1, total))
        emit(
            "progress",
            step=step,
            total_steps=total,
            epoch=epoch + 1,
            epochs=spec.hp.epochs,
            samples_per_s=round(rate, 2),
            eta_s=None if left is None else round(left, 1),
        )
    if spec.hp.checkpoint_steps and step % spec.hp.checkpoint_steps == 0 and not last_of_epoch:
        state["epoch"] = epoch
        save_checkpoint()
    return last_report


def _silent(*args, **kwargs) -> None:
    pass


def predict_rows(ops: ModelOps, space, tokenizer, rows, max_length, threshold, batch_size=64):
    preds: list[dict] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        encs = [data.encode(tokenizer, space.task_kind, r, max_length) for r in chunk]
        batch = data.collate([data.Example(e, None) for e in encs], tokenizer.pad_id)
        preds.extend(data.decode(space, ops.logits(batch), encs, chunk, threshold))
    return preds


def fit(spec: JobSpec, workdir: Path, emit: Emit, ops: ModelOps) -> dict:
    """Train; returns the final state (history of dev metrics, best step)."""
    hp = spec.hp
    started = time.perf_counter()
    train_rows = load_split(workdir, "train", spec.task_kind)
    dev_rows = load_split(workdir, "dev", spec.task_kind)
    if not train_rows:
        raise ValueError("the dataset version has no labeled rows in its train split")
    space = data.LabelSpace(spec.task_kind, tuple(spec.labels))
    tokenizer = tokenizer_for(spec, workdir, train_rows)
    items = data.examples(space, tokenizer, train_rows, hp.max_seq_length)
    per_epoch = data.steps_per_epoch(len(items), hp.batch_size)
    total = per_epoch * hp.epochs
    emit(
        "log",
        message=f"{len(train_rows)} training rows, {len(dev_rows)} dev rows, "
        f"{len(tokenizer.vocab)} tokens in the vocabulary, {total} steps",
    )

    checkpoint = workdir / CHECKPOINT
    _recover(checkpoint)
    _recover(workdir / BEST)
    ops.build(spec, space, len(tokenizer.vocab))
    # A multi-device job runs this loop in every process: each trains on its share of every
    # batch (the framework averages the gradients), all evaluate alike so that they stop alike,
    # and only the first reports and writes.
    world, rank = getattr(ops, "world", 1), getattr(ops, "rank", 0)
    if rank:
        emit = _silent
    elif world > 1:
        emit("log", message=f"{world} processes train this job, each on its share of a batch")
    state = resume_state(ops, checkpoint, emit)

    def save_vocab(tmp: Path) -> None:
        tokenizer.save(tmp / VOCAB)

    def save_checkpoint() -> None:
        if rank:
            return
        save_weights(ops, checkpoint, state, with_optimizer=True, more=save_vocab)
        emit("checkpoint", step=state["step"], epoch=state["epoch"])

    def save_best() -> None:
        if rank:
            return
        save_weights(ops, workdir / BEST, {"step": state["step"]}, more=save_vocab)

    # Model building (framework import, vocabulary, encoding, the model): apart from the steps.
    emit("state", phase="training", build_s=round(time.perf_counter() - started, 3))
    samples, busy = 0, 0.0
    stopped = False
    for epoch in range(state["epoch"], hp.epochs):
        skip = state["step"] - epoch * per_epoch
        last_report = 0.0
        for i, batch in enumerate(data.batches(items, hp.batch_size, shuffle_seed=hp.seed + epoch)):
            if i < skip:
                continue
            if world > 1:
                if len(batch) < world:
                    continue  # too small to share: every process skips it alike
                share = batch[rank::world]
            else:
                share = batch
            t0 = time.perf_counter()
            feed = data.collate(share, tokenizer.pad_id, space.head)
            loss = ops.train_step(feed, learning_rate(spec, state["step"], total))
            busy += time.perf_counter() - t0
            samples += len(batch)
            last_report = step_done(
                emit,
                spec,
                state,
                loss=loss,
                total=total,
                epoch=epoch,
                last_of_epoch=i == per_epoch - 1,
                samples=samples,
                busy=busy,
                per_step=hp.batch_size,
                last_report=last_report,
                save_checkpoint=save_checkpoint,
            )
        state["epoch"] = epoch + 1
        if dev_rows:
            preds = predict_rows(ops, space, tokenizer, dev_rows, hp.max_seq_length, hp.threshold)
            metrics = evaluate(spec.task_kind, list(space.labels), dev_rows, preds)
            value = float(metrics.get(hp.metric, metrics.get("micro_f1", 0.0)))
            summary = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
            state["history"].append({"step": state["step"], "epoch": epoch + 1, **summary})
            emit("metrics", step=state["step"], epoch=epoch + 1, split="dev", metrics=summary)
            if state["best"] is None or value > state["best"]:
                state.update(best=value, best_step=state["step"], bad_evals=0)
                save_best()
            else:
                state["bad_evals"] += 1
            if hp.early_stopping_patience and state["bad_evals"] >= hp.early_stopping_patience:
                emit(
                    "log",
                    message=f"early stopping after epoch {epoch + 1}: {hp.metric} has not "
                    f"improved for {state['bad_evals']} evaluations (best {state['best']:.4f})",
                )
                stopped = True
        else:
            state["best_step"] = state["step"]
            save_best()
        save_checkpoint()
        if stopped:
            break
    if not (workdir / BEST / "state.json").exists():
        save_best()
    state["samples_per_s"] = round(samples / busy, 2) if busy else None
    return state
