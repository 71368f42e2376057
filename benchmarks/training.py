"""Training speed: one model trained twice on the same rows in one run, once through the
platform (training_job_submit → Celery → a real train worker → the runner in .venv-runtime)
and once by a bare hand-written Paddle loop in a process of its own (same preset, vocabulary,
encoding, batches, optimizer, seed), and the platform's wait from submit to its first step.

    make bench      # or: .venv/bin/python benchmarks/training.py [--rows N] [--epochs N] [--smoke]

Samples/s of both sides count the same steps: within each epoch, from the end of its first
step to the end of its last (the platform's `loss` events, timed by the runner's own clock `t`),
so the model build, the first step's warm-up, evaluation and checkpoints lie outside. Redis is
REDIS_URL, or a throwaway one (platform/embedded_redis.py); database and data directory are
throwaway too. Aims: ratio ≥ 0.95; submit → first step under 3 s, model building excluded.

Ends with one JSON line: …, platform_samples_per_s, bare_samples_per_s, ratio,
submit_to_first_step_s.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

from _harness import (
    PRESET,  # ~0.15 s a step of 16 on a 2-core CPU: ≥ 15 s of steps
    ROOT,
    bench_team,
    import_version,
    jsonl,
    parse,
    print_result,
    review_rows,
    runtime_env,
    runtime_python,
    setup_django,
    start_train_worker,
    stop,
    under_redis,
    workspace,
)

# The bare loop, in the runtime venv (Paddle is only there): argv = root, train.jsonl, config.
BARE = r"""
import json, sys, time
started = time.perf_counter()
sys.path.insert(0, sys.argv[1])
import paddle
import paddle.nn.functional as F
from paddlenlp.transformers import ErnieConfig, ErnieForSequenceClassification
from runtime import data
from runtime.presets import PRESETS
from runtime.tokenizer import CharTokenizer

cfg = json.loads(sys.argv[3])
hp = cfg["hp"]
rows = data.read_rows(sys.argv[2])
space = data.LabelSpace("text_classification", tuple(cfg["labels"]))
tokenizer = CharTokenizer.build(row["text"] for row in rows)
items = data.examples(space, tokenizer, rows, hp["max_seq_length"])
paddle.set_device("cpu")
paddle.seed(hp["seed"])
config = ErnieConfig(vocab_size=len(tokenizer.vocab), num_labels=len(cfg["labels"]),
                     **PRESETS[cfg["preset"]])
config.hidden_dropout_prob = config.attention_probs_dropout_prob = hp["dropout"]
model = ErnieForSequenceClassification(config)
decay = {p.name for n, p in model.named_parameters() if not any(k in n for k in ("bias", "norm"))}
opt = paddle.optimizer.AdamW(learning_rate=hp["learning_rate"], parameters=model.parameters(),
                             weight_decay=hp["weight_decay"],
                             apply_decay_param_fun=lambda name: name in decay)
model.train()
build_s = time.perf_counter() - started
total = data.steps_per_epoch(len(items), hp["batch_size"]) * hp["epochs"]
warmup = int(total * hp["warmup_ratio"])
peak = hp["learning_rate"]
ends, losses = [], []
for epoch in range(hp["epochs"]):
    for batch in data.batches(items, hp["batch_size"], shuffle_seed=hp["seed"] + epoch):
        step = len(ends)
        opt.set_lr(peak * (step + 1) / warmup if step < warmup
                   else peak * max(0.0, (total - step) / max(1, total - warmup)))
        feed = data.collate(batch, tokenizer.pad_id, space.head)
        logits = model(input_ids=paddle.to_tensor(feed["input_ids"]),
                       token_type_ids=paddle.to_tensor(feed["token_type_ids"]))
        loss = F.cross_entropy(logits, paddle.to_tensor(feed["labels"]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))
        ends.append(time.time())
print(json.dumps({"rows": len(items), "vocab": len(tokenizer.vocab), "build_s": build_s,
                  "ends": ends, "losses": losses}))
"""


def make_rows(n: int, seed: int = 0) -> list[dict]:
    """Reviews of 20–70 characters whose label one keyword decides (learnable in an epoch)."""
    return review_rows(n, seed, filler=(18, 68))


def batch_size_at(step: int, rows: int, batch_size: int, per_epoch: int) -> int:
    """Samples in global step ``step`` (1-based): the last batch of an epoch may be short."""
    i = (step - 1) % per_epoch
    return min(batch_size, rows - i * batch_size)


def windows(loss_steps: list[int], per_epoch: int) -> list[list[int]]:
    """The steps of each epoch's loss events, in order: the measured steps of an epoch are
    first+1..last (the first includes the warm-up; evaluation and checkpoints come after the
    last)."""
    by_epoch: dict[int, list[int]] = {}
    for step in sorted(loss_steps):
        by_epoch.setdefault((step - 1) // per_epoch, []).append(step)
    return [s for _e, s in sorted(by_epoch.items()) if len(s) > 1]


def rate(
    pairs: list[tuple[int, int]], end_of: dict[int, float], sizes: Callable[[int], int]
) -> tuple[int, float]:
    """Samples and seconds of steps a+1..b of each (a, b), ``end_of`` a step's end time."""
    samples = sum(sizes(s) for a, b in pairs for s in range(a + 1, b + 1))
    seconds = sum(end_of[b] - end_of[a] for a, b in pairs)
    return samples, seconds


def median_rate(
    pairs: list[tuple[int, int]], end_of: dict[int, float], sizes: Callable[[int], int]
) -> float:
    """The median samples/s of the intervals: what other work on the machine did to a few of
    them does not move it, a cost paid in every interval does."""
    rates = (rate([pair], end_of, sizes) for pair in pairs)
    return statistics.median(samples / seconds for samples, seconds in rates)


def train_lines(version) -> list[bytes]:
    """The version's train split, the lines the runner's data/train.jsonl gets, in its order."""
    from django.core.files.storage import default_storage

    with default_storage.open(version.data_file, "rb") as f:
        return [line for line in f if json.loads(line).get("split", "train") == "train"]


def run_platform(user, team, version, hp: dict, timeout: float = 1800):
    from training.jobs import training_job_submit
    from training.models import TrainingJob

    job = training_job_submit(
        actor=user, team=team, dataset_version=version, preset=PRESET, hyperparameters=hp
    )
    deadline, phase = time.monotonic() + timeout, None
    while job.status in (TrainingJob.Status.QUEUED, TrainingJob.Status.RUNNING):
        if time.monotonic() > deadline:
            sys.exit(f"the job is still {job.status} ({job.phase}) after {timeout:.0f} s")
        time.sleep(0.5)
        job.refresh_from_db()
        if job.phase and job.phase != phase:
            phase = job.phase
            print(f"  platform: {phase}", flush=True)
    if job.status != TrainingJob.Status.SUCCEEDED:
        sys.exit(f"the job {job.status}: {job.error}")
    return job


def run_bare(train_file: Path, labels: list[str], hp: dict) -> dict:
    config = json.dumps({"labels": labels, "preset": PRESET, "hp": hp}, ensure_ascii=False)
    out = subprocess.run(
        [runtime_python(), "-c", BARE, str(ROOT), str(train_file), config],
        cwd=ROOT,
        env=runtime_env(),  # as runner_env sets for paddle
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        sys.exit(f"the bare loop failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    # --smoke: one epoch of three steps (two measured intervals need three loss events).
    args = parse(parser, smoke={"rows": 60, "epochs": 1})
    # Under a throwaway Redis of its own: no other train worker takes its job.
    under_redis("TRAINING_BENCH_REDIS")
    hp: dict[str, Any] = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "max_seq_length": 128,
        "learning_rate": 1e-3,
        "warmup_ratio": 0.1,
        "weight_decay": 0.01,
        "seed": 42,
        "dropout": 0.1,
        "early_stopping_patience": 0,
        "checkpoint_steps": 0,  # checkpoints only at epoch ends, outside the measured steps
    }
    with workspace("bench-train-") as tmp_name:
        tmp = Path(tmp_name)
        setup_django(tmp)
        from runtime.data import steps_per_epoch

        user, team = bench_team()
        mapping = {"text": "text", "label": "label"}
        version = import_version(user, team, jsonl(make_rows(args.rows)), "jsonl", mapping)
        train_file = tmp / "train.jsonl"
        train_file.write_bytes(b"".join(train_lines(version)))
        n_train = version.split_counts["train"]
        per_epoch = steps_per_epoch(n_train, hp["batch_size"])
        print(
            f"{args.rows} rows, {n_train} in train: {per_epoch} steps an epoch of "
            f"{hp['batch_size']}, {args.epochs} epochs, preset {PRESET}; load average "
            f"{os.getloadavg()[0]:.2f} (other work on the CPU skews both sides)",
            flush=True,
        )

        worker = start_train_worker(f"bench-{os.getpid()}", tmp / "worker.log")
        try:
            time.sleep(1)  # an idle worker: its pool process forked and waiting
            job = run_platform(user, team, version, hp)
        finally:
            stop(worker)
        print("  bare loop: training", flush=True)
        bare = run_bare(train_file, list(job.labels), hp)
        report(job, bare, hp, args.rows, n_train, per_epoch)


def report(job, bare: dict, hp: dict, rows: int, n_train: int, per_epoch: int) -> None:
    events = list(
        job.events.filter(kind__in=("state", "loss")).values_list("kind", "data", "created_at")
    )
    state = {d["phase"]: d for k, d, _c in events if k == "state"}
    loss_t = {d["step"]: d["t"] for k, d, _c in events if k == "loss"}
    loss_v = {d["step"]: d["loss"] for k, d, _c in events if k == "loss"}
    # How long a loss line waited before the supervisor read it (created_at: when it was read).
    read_lag = [c.timestamp() - d["t"] for k, d, c in events if k == "loss"]
    assert job.total_steps == per_epoch * hp["epochs"] == len(bare["ends"]), job.total_steps
    assert bare["rows"] == n_train, (bare["rows"], n_train)
    epochs = windows(list(loss_t), per_epoch)
    spans = [(s[0], s[-1]) for s in epochs]
    intervals = [pair for s in epochs for pair in pairwise(s)]
    bare_end = dict(enumerate(bare["ends"], start=1))

    def sizes(step: int) -> int:
        return batch_size_at(step, n_train, hp["batch_size"], per_epoch)

    p_samples, p_seconds = rate(spans, loss_t, sizes)
    b_samples, b_seconds = rate(spans, bare_end, sizes)
    platform_rate, bare_rate = p_samples / p_seconds, b_samples / b_seconds
    ratio = platform_rate / bare_rate
    median_ratio = median_rate(intervals, loss_t, sizes) / median_rate(intervals, bare_end, sizes)

    # Submit → first step, piece by piece (the runner's `t` and the database's times share the
    # machine's clock).
    build_s = float(state["training"]["build_s"])
    raw_s = (job.first_step_at - job.created_at).total_seconds()
    submit_s = raw_s - build_s
    pieces = {
        "queue and claim": (job.started_at - job.created_at).total_seconds(),
        "workdir and runner start": state["loading"]["t"] - job.started_at.timestamp(),
        "backend load": state["training"]["t"] - build_s - state["loading"]["t"],
        "first step": loss_t[1] - state["training"]["t"],
        "until the supervisor read it": job.first_step_at.timestamp() - loss_t[1],
    }
    last = max(loss_v)

    print(
        f"measured: {sum(b - a for a, b in spans)} steps, {p_samples} samples, "
        f"in {len(spans)} epoch windows"
    )
    print(
        f"platform: {platform_rate:8.1f} samples/s  ({p_seconds:.2f} s; the loop's own figure "
        f"{job.samples_per_s} samples/s, all steps)"
    )
    print(f"bare    : {bare_rate:8.1f} samples/s  ({b_seconds:.2f} s)")
    print(
        f"ratio   : {ratio:.3f}  (aim ≥ 0.95); of the median of {len(intervals)} intervals "
        f"between loss events: {median_ratio:.3f} (when far apart, other work on the CPU "
        "skewed one side)"
    )
    print(
        f"same training: last loss {loss_v[last]:.6f} (platform) vs "
        f"{bare['losses'][last - 1]:.6f} (bare) at step {last}"
    )
    print(
        f"submit → first step: {raw_s:.2f} s raw, {build_s:.2f} s of it model building "
        f"(the bare loop's: {bare['build_s']:.2f} s); {submit_s:.2f} s without (aim < 3 s)"
    )
    print("  " + "; ".join(f"{name} {s:.2f} s" for name, s in pieces.items()))
    print(
        f"  the supervisor read loss lines {sum(read_lag) / len(read_lag):.2f} s after they "
        f"were written on average, {max(read_lag):.2f} s at most"
    )
    print_result(
        {
            "rows": rows,
            "train_rows": n_train,
            "steps": sum(b - a for a, b in spans),
            "build_s": round(build_s, 3),
            "submit_to_first_step_raw_s": round(raw_s, 3),
            "median_interval_ratio": round(median_ratio, 3),
            "platform_samples_per_s": round(platform_rate, 2),
            "bare_samples_per_s": round(bare_rate, 2),
            "ratio": round(ratio, 3),
            "submit_to_first_step_s": round(submit_s, 3),
        }
    )


if __name__ == "__main__":
    main()
