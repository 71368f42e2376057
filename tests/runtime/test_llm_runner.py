"""The causal-LM loop through the job runner (``python -m runtime.run``) in the runtime venv:
full fine-tuning with packing, recomputation and gradient accumulation on each backend, and a
runner killed mid-job that resumes from its checkpoint to the same number of steps."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.spec import Hyperparameters, JobSpec

ROOT = Path(__file__).resolve().parent.parent.parent


def sums(n: int) -> list[dict]:
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)][:n]
    return [
        {
            "messages": [
                {"role": "user", "content": f"{a}加{b}等于几？"},
                {"role": "assistant", "content": f"{a}加{b}等于{a + b}。"},
            ]
        }
        for a, b in pairs
    ]


def workdir(tmp: Path, backend: str, **hp) -> Path:
    rows = sums(81)
    data = tmp / "data"
    data.mkdir(parents=True)
    for split, part in (("train", rows[:65]), ("dev", rows[65:73]), ("test", rows[73:])):
        (data / f"{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part), "utf-8"
        )
    values = {
        "epochs": 3,
        "batch_size": 8,
        "learning_rate": 1e-2,
        "max_seq_length": 64,
        "checkpoint_steps": 0,
        "eval_generations": 2,
        "max_new_tokens": 8,
        **hp,
    }
    JobSpec(
        job_id=1,
        task_kind="instruction",
        labels=[],
        backend=backend,
        preset="llama-tiny-char",
        hyperparameters=Hyperparameters(**values),
    ).save(tmp)
    return tmp


def runner(directory: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "runtime.run", str(directory)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def events(lines: list[str]) -> list[dict]:
    return [json.loads(x[len("@@event ") :]) for x in lines if x.startswith("@@event ")]


@pytest.mark.parametrize("backend", ["paddle", "torch"])
def test_full_fine_tuning_with_packing_recompute_and_accumulation(tmp_path, backend):
    directory = workdir(
        tmp_path,
        backend,
        method="full",
        packing=True,
        recompute=True,
        gradient_accumulation_steps=2,
        learning_rate=2e-3,
        max_seq_length=128,
    )
    proc = runner(directory)
    out = proc.communicate(timeout=600)[0].splitlines()
    assert proc.returncode == 0, "\n".join(out[-40:])
    seen = events(out)
    # 65 conversations of about 36 tokens packed by threes into 128: 22 sequences, 3
    # micro-batches of 8 an epoch, so one step of two micro-batches (the third stays out).
    log = " ".join(e.get("message", "") for e in seen if e["kind"] == "log")
    assert "65 training rows (22 sequences)" in log, log
    assert "steps of 16 sequences" in log and "method full" in log
    steps = [e["step"] for e in seen if e["kind"] == "loss"]
    assert steps[-1] == 3
    evaluation = json.loads((directory / "evaluation.json").read_text())
    assert evaluation["history"][-1]["loss"] < evaluation["history"][0]["loss"]
    assert (directory / "export" / "manifest.json").exists()


def test_a_killed_runner_resumes_from_its_checkpoint(tmp_path):
    directory = workdir(tmp_path, "paddle", epochs=6, checkpoint_steps=5)
    proc = runner(directory)
    seen: list[str] = []
    deadline = time.monotonic() + 300
    while True:  # until a checkpoint past the first epoch's end is written
        line = proc.stdout.readline()
        assert line, "\n".join(seen[-40:])
        seen.append(line.strip())
        found = events(seen[-1:])
        if found and found[0]["kind"] == "checkpoint" and found[0]["step"] >= 10:
            break
        assert time.monotonic() < deadline
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = found[0]["step"]

    again = runner(directory)
    out = again.communicate(timeout=600)[0].splitlines()
    assert again.returncode == 0, "\n".join(out[-40:])
    seen_again = events(out)
    resumed = next(e for e in seen_again if e["kind"] == "resumed")
    assert resumed["step"] >= killed_at
    steps = [e["step"] for e in seen_again if e["kind"] == "loss"]
    assert min(steps) > resumed["step"] and steps[-1] == 6 * 9  # 65 rows in batches of 8
    assert json.loads((directory / "evaluation.json").read_text())["steps"] == 6 * 9


def test_rows_rated_below_min_rating_do_not_train(tmp_path):
    from runtime.llm import load_rows

    rows = sums(4)
    rows[0]["rating"], rows[1]["rating"], rows[2]["rating"] = 1, 4, 5  # rows[3]: unrated
    rows.append({"messages": [{"role": "user", "content": "还没有回答"}]})
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8"
    )
    assert len(load_rows(tmp_path, "train", "instruction")) == 4  # the unanswered row is out
    kept = load_rows(tmp_path, "train", "instruction", min_rating=4)
    assert [r.get("rating") for r in kept] == [4, 5, None]  # unrated rows are kept
