"""The training loop every backend shares: epochs, shuffling, warm-up and decay of the learning
rate, checkpoints and resuming, evaluation on the dev split, the best model, early stopping and
the events the console shows. A backend supplies only a ``ModelOps``: how its framework builds,
steps, predicts, saves and loads a model.

Resume: ``checkpoint/`` holds the weights, the optimizer and ``state.json`` (epoch, step, best
metric, history, the seconds spent and the steps a time budget planned). A job started again
after its worker died goes on from that step: the batches of each epoch are shuffled by
``seed + epoch``, so the skipped ones are exactly those already trained on.

Time budget (``max_minutes``): after a short warm-up the loop measures the seconds a step and a
dev evaluation take and plans the steps that fit (``plan_steps``); they become the schedule's
total, so the learning rate decays to zero within the budget, and the best weights are exported.

Pause: the train worker asks a job to stop (its team's device-hour quota is used) by creating
``PAUSE_REQUEST`` in the work directory; at the end of the epoch it is in (after the checkpoint),
every process of the job agrees and the loop raises ``Paused``: the runner reports it and exits,
and the job resumes from that checkpoint when it runs again.
"""

import errno
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
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
PAUSE_REQUEST = "pause-requested"


class Paused(Exception):
    """Training stopped at an epoch's end, its checkpoint saved, because the job was asked to."""

    def __init__(self, step: int, epoch: int) -> None:
        super().__init__(f"paused at step {step}, after epoch {epoch}")
        self.step, self.epoch = step, epoch


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


def plan_steps(
    *,
    budget_s: float,
    elapsed_s: float,
    step_s: float,
    eval_s: float,
    reserve_s: float,
    done: int,
    per_epoch: int,
    total: int,
) -> int:
    """The step training may go on to within a time budget of ``budget_s`` seconds, of which
    ``elapsed_s`` are spent and ``reserve_s`` are kept for the export and the test evaluation:
    from step ``done``, steps of ``step_s`` seconds, and an epoch's end of ``eval_s`` (the dev
    evaluation and the checkpoints) after each epoch (of ``per_epoch`` steps) and where training
    stops within an epoch. At most ``total`` (every epoch), at least ``done``."""
    left = budget_s - elapsed_s - reserve_s
    step = done
    while step < total:
        epoch_end = min(total, (step // per_epoch + 1) * per_epoch)
        cost = (epoch_end - step) * step_s + eval_s
        if cost <= left:
            left -= cost
            step = epoch_end
            continue
        # Part of this epoch, then the evaluation where it stops.
        if step_s > 0:
            step += max(0, int((left - eval_s) / step_s))
        break
    return step


class Budget:
    """A job's time budget (``max_minutes``) as a loop spends it. The loop reports each step's
    seconds (``stepped``) and each epoch end's (``evaluated``: the dev evaluation and the
    checkpoints); once a warm-up is measured (``WARMUP_STEPS`` steps or ``WARMUP_S`` seconds,
    the first step of an attempt left out: it compiles and allocates), ``total`` becomes the
    steps that fit, planned again at each epoch's end from what was measured so far. A step past
    the budget (the throughput fell) cuts training there. The seconds spent count over resumed
    attempts (``state["elapsed_s"]``); a budget of 0 plans nothing."""

    WARMUP_STEPS, WARMUP_S = 10, 5.0
    # Kept for the export and the test evaluation: this share of the budget, and the test
    # split's evaluation estimated from the dev split's.
    RESERVE = 0.1

    def __init__(
        self,
        spec: JobSpec,
        state: dict[str, Any],
        emit: Emit,
        *,
        per_epoch: int,
        total: int,
        test_share: float,
        started: float,
        agree: Callable[[float], float] = float,
    ) -> None:
        # ``agree``: the largest of a figure over the processes of a multi-device job, so that
        # all plan and stop alike.
        self.agree = agree
        self.budget_s = spec.hp.max_minutes * 60
        self.emit, self.per_epoch, self.full = emit, per_epoch, total
        self.test_share = test_share
        self.started, self.spent_before = started, float(state.get("elapsed_s") or 0.0)
        self.total = min(total, state.get("planned_steps") or total) if self.budget_s else total
        self.planned = False
        self.cut = False
        self.measured_steps, self.measured_s, self.first = 0, 0.0, True
        self.eval_s: float | None = None
        self.reserve_s = self.RESERVE * self.budget_s

    def elapsed(self) -> float:
        return self.agree(self.spent_before + time.perf_counter() - self.started)

    def evaluated(self, seconds: float) -> None:
        self.eval_s = self.agree(seconds) if self.budget_s else seconds

    def stepped(
        self, state: dict[str, Any], seconds: float, probe_eval: Callable[[], float]
    ) -> int:
        """After a step of ``seconds``: plan once the warm-up is measured, cut when time is up.
        Returns the step training goes on to."""
        if not self.budget_s:
            return self.total
        if self.first:
            self.first = False
        else:
            self.measured_steps += 1
            self.measured_s += seconds
        warm = self.measured_steps >= self.WARMUP_STEPS or (
            self.measured_steps > 0
            and not self.planned
            and self.agree(self.measured_s) >= self.WARMUP_S
        )
        if not self.planned and warm:
            self.plan(state, probe_eval)
        if state["step"] < self.total and self.elapsed() >= self.budget_s - self.reserve_s:
            self.total = state["planned_steps"] = state["step"]
            self.cut = True
        return self.total

    def plan(self, state: dict[str, Any], probe_eval: Callable[[], float]) -> None:
        """Plan the steps that fit (``probe_eval``: an epoch end's seconds, before one was
        measured); the first plan is reported, later ones refine it."""
        if not self.budget_s or not self.measured_steps or self.cut:
            return
        first, self.planned = not self.planned, True
        step_s = self.agree(self.measured_s) / max(1, self.measured_steps)
        if self.eval_s is None:
            self.eval_s = self.agree(probe_eval())
        self.reserve_s = self.RESERVE * self.budget_s + self.eval_s * self.test_share
        self.total = plan_steps(
            budget_s=self.budget_s,
            elapsed_s=self.elapsed(),
            step_s=step_s,
            eval_s=self.eval_s,
            reserve_s=self.reserve_s,
            done=state["step"],
            per_epoch=self.per_epoch,
            total=self.full,
        )
        state["planned_steps"] = self.total
        if not first:
            return
        epochs, of = self.total / self.per_epoch, self.full // self.per_epoch
        self.emit(
            "log",
            message=f"budget {self.budget_s / 60:g} min: {epochs:.3g} of {of}"
            f" epochs ({self.total} of {self.full} steps) fit at {step_s:.3g} s/step and "
            f"{self.eval_s:.3g} s an epoch's end (dev evaluation, checkpoint), "
            f"{self.elapsed():.0f} s spent",
            budget_steps=self.total,
            step_s=round(step_s, 4),
            eval_s=round(self.eval_s, 3),
        )

    def epochs(self) -> int:
        return math.ceil(self.total / self.per_epoch)

    def stopped(self, state: dict[str, Any]) -> None:
        """Say so where the budget ended training before its last epoch."""
        if self.budget_s and state["step"] < self.full:
            how = "the time ran out" if self.cut else "as planned"
            self.emit(
                "log",
                message=f"budget {self.budget_s / 60:g} min: training stopped at step "
                f"{state['step']} of {self.full} ({how}, {self.elapsed():.0f} s spent); the "
                f"best checkpoint (step {state['best_step']}) is exported",
            )


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
    epochs: int | None = None,
) -> float:
    """After an optimiser step: count it, stop on a non-finite loss, send the loss and progress
    events at most twice a second (and at the epoch's and the job's last step; ``samples``
    trained in ``busy`` seconds so far, ``per_step`` samples a step), save a checkpoint every
    ``checkpoint_steps`` within an epoch (``epochs``: those planned, where a time budget cut
    them). Returns when the events were last sent."""
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
            epochs=epochs or spec.hp.epochs,
            samples_per_s=round(rate, 2),
            eta_s=None if left is None else round(left, 1),
        )
    if spec.hp.checkpoint_steps and step % spec.hp.checkpoint_steps == 0 and not last_of_epoch:
        state["epoch"] = epoch
        save_checkpoint()
    return last_report


def ended_early(emit: Emit, state: dict[str, Any], total: int, samples: int, busy: float) -> None:
    """Where early stopping or a time budget ended training before ``total`` steps: the job's
    progress ends at the step it reached."""
    if state["step"] < total:
        emit(
            "progress",
            step=state["step"],
            total_steps=state["step"],
            epoch=state["epoch"],
            epochs=state["epoch"],
            samples_per_s=round(samples / busy, 2) if busy else 0.0,
            eta_s=0.0,
        )


def recovered_checkpoint(workdir: Path) -> Path:
    """The job's checkpoint directory, it and ``best/`` made whole after a kill mid-write."""
    checkpoint = workdir / CHECKPOINT
    _recover(checkpoint)
    _recover(workdir / BEST)
    return checkpoint


class Progress:
    """What every training loop does around its own steps and evaluation: the epochs left (a
    resumed one without the steps already done), each step timed (throughput, time budget) and
    reported (``step_done``), each epoch's end (the dev figures, the best weights, early
    stopping, the checkpoint, the budget's plan) and the end of training. ``checkpoint_files``
    and ``best_files`` write what a loop keeps beside the weights; a process that does not
    write (``writes`` False: a multi-device job's others) saves nothing. ``probe()``: a dev
    evaluation's seconds, estimated before one was measured."""

    def __init__(
        self,
        spec: JobSpec,
        state: dict[str, Any],
        emit: Emit,
        budget: Budget,
        *,
        ops: _Checkpointed,
        workdir: Path,
        per_step: int,
        probe: Callable[[], float],
        checkpoint_files: Callable[[Path], None] | None = None,
        best_files: Callable[[Path], None] | None = None,
        writes: bool = True,
    ) -> None:
        self.spec, self.state, self.emit, self.budget = spec, state, emit, budget
        self.ops, self.workdir, self.per_step, self.probe = ops, workdir, per_step, probe
        self.checkpoint_files, self.best_files, self.writes = checkpoint_files, best_files, writes
        self.epoch = state["epoch"]
        self.samples, self.busy, self.last_report, self.stopped = 0, 0.0, 0.0, False
        self.step_started = 0.0
        self.saved_plan = state.get("planned_steps")

    def save_checkpoint(self) -> None:
        self.state["elapsed_s"] = round(self.budget.elapsed(), 3)
        self.saved_plan = self.state.get("planned_steps")
        if not self.writes:
            return
        save_weights(
            self.ops,
            self.workdir / CHECKPOINT,
            self.state,
            with_optimizer=True,
            more=self.checkpoint_files,
        )
        self.emit("checkpoint", step=self.state["step"], epoch=self.state["epoch"])

    def save_best(self) -> None:
        if self.writes:
            save_weights(
                self.ops, self.workdir / BEST, {"step": self.state["step"]}, more=self.best_files
            )

    def probe_eval(self) -> float:
        """An epoch end's seconds before one was measured: ``probe()`` and a checkpoint (a
        real one, of this step)."""
        predicted = self.probe()
        t0 = time.perf_counter()
        self.state["epoch"] = self.epoch  # mid-epoch, as step_done saves one
        self.save_checkpoint()
        return predicted + time.perf_counter() - t0

    def epochs(self) -> Iterator[tuple[int, int]]:
        """The epochs left, each with how many of its steps a resumed job already did; none
        once early stopping or the total of steps ended training. Between two epochs, a
        pause asked for (``PAUSE_REQUEST``) raises ``Paused``: the checkpoint is that epoch's."""
        first = self.state["epoch"]
        for epoch in range(first, self.spec.hp.epochs):
            if self.stopped or self.state["step"] >= self.budget.total:
                return
            if epoch > first and self.pause_requested():
                raise Paused(self.state["step"], epoch)
            self.epoch, self.last_report = epoch, 0.0
            yield epoch, self.state["step"] - epoch * self.budget.per_epoch

    def pause_requested(self) -> bool:
        """Whether the job was asked to pause, as every process of a multi-device job sees it:
        each reads the request (the work directory is shared), and all take the largest answer
        (an all-reduce), so that none goes on alone into the next epoch."""
        asked = float((self.workdir / PAUSE_REQUEST).exists())
        agree = getattr(self.ops, "agree_max", None)
        if getattr(self.ops, "world", 1) > 1 and agree is not None:
            asked = agree(asked)
        return asked > 0

    def begin_step(self) -> float:
        """Before an optimizer step: its learning rate."""
        self.step_started = time.perf_counter()
        return learning_rate(self.spec, self.state["step"], self.budget.total)

    def end_step(self, loss: float, samples: int, *, last_of_epoch: bool) -> None:
        """After an optimizer step on ``samples`` samples, of ``loss``."""
        t0 = self.step_started
        self.busy += time.perf_counter() - t0
        self.samples += samples
        total, reported = self.budget.total, self.last_report
        self.last_report = step_done(
            self.emit,
            self.spec,
            self.state,
            loss=loss,
            total=self.budget.total,
            epoch=self.epoch,
            last_of_epoch=last_of_epoch,
            samples=self.samples,
            busy=self.busy,
            per_step=self.per_step,
            last_report=self.last_report,
            save_checkpoint=self.save_checkpoint,
            epochs=self.budget.epochs(),
        )
        step = self.state["step"]
        cut = self.budget.stepped(self.state, time.perf_counter() - t0, self.probe_eval) == step
        if cut and self.last_report == reported and step < total:
            # The time budget ended training at a step the throttle did not report: its loss
            # still ends the curve.
            lr = learning_rate(self.spec, step - 1, total)
            self.emit("loss", step=step, loss=round(loss, 6), lr=lr)

    def end_epoch(
        self,
        evaluate: Callable[[], tuple[dict[str, Any], float]] | None,
        *,
        what: str,
        lower_is_better: bool = False,
        show_best: bool = True,
    ) -> None:
        """After an epoch: ``evaluate()`` gives the dev figures and the one that picks the best
        weights (``what`` it is, for early stopping's message); None where there is no dev
        split: the last weights are the best."""
        state, epoch = self.state, self.epoch
        state["epoch"] = epoch + 1
        ending = time.perf_counter()
        if evaluate is not None:
            metrics, value = evaluate()
            state["history"].append({"step": state["step"], "epoch": epoch + 1, **metrics})
            self.emit("metrics", step=state["step"], epoch=epoch + 1, split="dev", metrics=metrics)
            best = state["best"]
            if best is None or (value < best if lower_is_better else value > best):
                state.update(best=value, best_step=state["step"], bad_evals=0)
                self.save_best()
            else:
                state["bad_evals"] += 1
            patience = self.spec.hp.early_stopping_patience
            if patience and state["bad_evals"] >= patience:
                shown = f" (best {state['best']:.4f})" if show_best else ""
                self.emit(
                    "log",
                    message=f"early stopping after epoch {epoch + 1}: {what} has not improved "
                    f"for {state['bad_evals']} evaluations{shown}",
                )
                self.stopped = True
        else:
            state["best_step"] = state["step"]
            self.save_best()
        self.save_checkpoint()
        self.budget.evaluated(time.perf_counter() - ending)
        self.budget.plan(state, self.probe_eval)

    def finish(self, total: int) -> None:
        """The best weights are the last where no evaluation kept any; the progress ends where
        training did (of ``total`` steps)."""
        if not (self.workdir / BEST / "state.json").exists():
            self.save_best()
        if not self.stopped:
            self.budget.stopped(self.state)
        if self.budget.budget_s and self.saved_plan != self.state["step"]:
            # The checkpoint may keep a plan the time did not give (an epoch's end saves it
            # before planning again): it says where training ended, so a job started again
            # trains no further.
            self.state["planned_steps"] = self.state["step"]
            self.save_checkpoint()
        ended_early(self.emit, self.state, total, self.samples, self.busy)
        self.state["samples_per_s"] = round(self.samples / self.busy, 2) if self.busy else None


def _silent(*args, **kwargs) -> None:
    pass


def predict_rows(ops: ModelOps, space, tokenizer, rows, max_length, threshold, batch_size=64):
    """Predictions of the model in training, as its export will give them (``data.predict``)."""
    # A tagger with a CRF decodes through its transitions (runtime.backends.paddle_models).
    transitions = ops.transitions() if hasattr(ops, "transitions") else None
    return data.predict(
        ops.logits, tokenizer, space, rows, max_length, threshold, transitions, batch_size
    )


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
    # A text longer than max_seq_length trains as overlapping windows (data.item_windows).
    windowed = f" in {len(items)} windows" if len(items) > len(train_rows) else ""
    emit(
        "log",
        message=f"{len(train_rows)} training rows{windowed}, {len(dev_rows)} dev rows, "
        f"{len(tokenizer.vocab)} tokens in the vocabulary, {total} steps",
    )

    checkpoint = recovered_checkpoint(workdir)
    if hasattr(ops, "size_to"):  # a model some of whose sizes its training examples choose
        ops.size_to(items)
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
    budget = Budget(
        spec,
        state,
        emit,
        per_epoch=per_epoch,
        total=total,
        test_share=_test_share(workdir, spec, dev_rows),
        started=started,
        agree=_agreement(ops, world, spec),
    )

    def save_vocab(tmp: Path) -> None:
        tokenizer.save(tmp / VOCAB)

    def probe() -> float:
        """Predictions for a few dev rows, scaled to the split."""
        t0 = time.perf_counter()
        sample = dev_rows[:64]
        if sample:
            predict_rows(ops, space, tokenizer, sample, hp.max_seq_length, hp.threshold)
        return (time.perf_counter() - t0) * len(dev_rows) / max(1, len(sample))

    def dev_metrics() -> tuple[dict[str, Any], float]:
        preds = predict_rows(ops, space, tokenizer, dev_rows, hp.max_seq_length, hp.threshold)
        metrics = evaluate(spec.task_kind, list(space.labels), dev_rows, preds)
        value = float(metrics.get(hp.metric, metrics.get("micro_f1", 0.0)))
        return {k: v for k, v in metrics.items() if isinstance(v, int | float)}, value

    progress = Progress(
        spec,
        state,
        emit,
        budget,
        ops=ops,
        workdir=workdir,
        per_step=hp.batch_size,
        probe=probe,
        checkpoint_files=save_vocab,
        best_files=save_vocab,
        writes=not rank,
    )
    if hasattr(ops, "warm_start"):
        # A model that starts from a solved part (a fast preset's classical wide part) is
        # scored before its first step: training keeps that start unless it does better.
        # Resumed, the checkpoint brings the part back, and only what was held out of its
        # solve is made again.
        resumed = state["step"] > 0
        message = ops.warm_start(items, resumed=resumed)
        if message:
            emit("log", message=message)
            if dev_rows and not resumed:
                metrics, value = dev_metrics()
                state.update(best=value, best_step=0, bad_evals=0)
                state["history"].append({"step": 0, "epoch": 0, **metrics})
                emit("metrics", step=0, epoch=0, split="dev", metrics=metrics)
                progress.save_best()
    # Model building (framework import, vocabulary, encoding, the model): apart from the steps.
    emit("state", phase="training", build_s=round(time.perf_counter() - started, 3))
    for epoch, skip in progress.epochs():
        for i, batch in enumerate(data.batches(items, hp.batch_size, shuffle_seed=hp.seed + epoch)):
            if i < skip:
                continue
            if state["step"] >= budget.total:
                break
            if world > 1:
                if len(batch) < world:
                    continue  # too small to share: every process skips it alike
                share = batch[rank::world]
            else:
                share = batch
            lr = progress.begin_step()
            loss = ops.train_step(data.collate(share, tokenizer.pad_id, space.head), lr)
            progress.end_step(loss, len(batch), last_of_epoch=i == per_epoch - 1)
        progress.end_epoch(dev_metrics if dev_rows else None, what=hp.metric)
    progress.finish(total)
    return state


def _test_share(workdir: Path, spec: JobSpec, dev_rows: list[dict]) -> float:
    """The test split's evaluation as a share of the dev split's (for a budget's reserve)."""
    if not spec.hp.max_minutes or not dev_rows:
        return 0.0
    return len(load_split(workdir, "test", spec.task_kind)) / len(dev_rows)


def _agreement(ops: Any, world: int, spec: JobSpec) -> Callable[[float], float]:
    """The largest of a figure over a multi-device job's processes, through the backend's
    ``agree_max`` (an all-reduce); alone or without a budget, the figure itself."""
    if world == 1 or not spec.hp.max_minutes:
        return float
    agree = getattr(ops, "agree_max", None)
    if agree is None:
        raise ValueError(
            f"the {type(ops).__name__} backend cannot share a time budget between processes: "
            "train on one device or without max_minutes"
        )
    return agree
