"""Early stopping (on by default), a job's time budget (``max_minutes``) and a pause asked for
(its team's quota): the plan of the steps that fit as a pure function, and the shared loop with
the paddle backend's real ops through the runner, which exports the best checkpoint (no
Django)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import runtime.run as runner
from runtime.loop import BEST, CHECKPOINT, PAUSE_REQUEST, plan_steps
from runtime.spec import Hyperparameters
from tests.helpers.workdir import make_workdir

pytest.importorskip("paddle")


def plan(**given) -> int:
    values = {
        "budget_s": 100.0,
        "elapsed_s": 0.0,
        "step_s": 1.0,
        "eval_s": 0.0,
        "reserve_s": 0.0,
        "done": 0,
        "per_epoch": 10,
        "total": 50,
    }
    return plan_steps(**{**values, **given})


def test_every_epoch_fits_a_large_budget() -> None:
    assert plan(budget_s=1000) == 50
    assert plan(budget_s=55, eval_s=1) == 50  # 5 × (10 steps + an evaluation)


def test_the_steps_that_fit_with_evaluations_and_the_reserve() -> None:
    # 32 s: 2 whole epochs (2 × 11 s), then 9 steps and the evaluation where they stop.
    assert plan(budget_s=40, eval_s=1, reserve_s=8) == 29
    # Time already spent (a resumed job) counts; a plan starts from the steps done.
    assert plan(budget_s=40, eval_s=1, reserve_s=8, elapsed_s=11, done=10) == 29
    assert plan(budget_s=40, step_s=0.5, done=7) == 50
    # Spent: training stops where it is, never before it.
    assert plan(budget_s=10, elapsed_s=12, done=13) == 13
    assert plan(budget_s=10, eval_s=20) == 0


def test_early_stopping_is_on_by_default() -> None:
    assert Hyperparameters().early_stopping_patience > 0
    assert Hyperparameters().max_minutes == 0


@pytest.fixture
def events(monkeypatch) -> list[tuple[str, dict]]:
    seen: list[tuple[str, dict]] = []
    monkeypatch.setattr(runner, "emit", lambda kind, **d: seen.append((kind, d)))
    return seen


def test_early_stopping_ends_training_and_exports_the_best(tmp_path: Path, events) -> None:
    # A learning rate too small to change a prediction: the dev metric stays where the first
    # epoch left it, and the default patience stops training that many epochs later.
    workdir, spec = make_workdir(
        tmp_path, "text_classification", sizes=(32, 8, 8), epochs=20, learning_rate=1e-12
    )
    patience = spec.hp.early_stopping_patience
    assert patience == Hyperparameters().early_stopping_patience
    spec.backend = "paddle"
    spec.save(workdir)
    evaluation = runner.run(workdir)

    per_epoch = 4
    assert [h["epoch"] for h in evaluation["history"]] == list(range(1, patience + 2))
    assert evaluation["steps"] == (patience + 1) * per_epoch
    assert evaluation["best_step"] == per_epoch
    assert json.loads((workdir / BEST / "state.json").read_text())["step"] == per_epoch
    logs = [d["message"] for k, d in events if k == "log" and "message" in d]
    assert any(m.startswith(f"early stopping after epoch {patience + 1}") for m in logs), logs
    last = [d for k, d in events if k == "progress"][-1]
    assert last["step"] == last["total_steps"] == evaluation["steps"]
    assert (workdir / "export" / "manifest.json").is_file()


def test_a_time_budget_cuts_the_epochs_and_exports_the_best(tmp_path: Path, events) -> None:
    budget_s = 8.0
    workdir, spec = make_workdir(
        tmp_path,
        "text_classification",
        sizes=(32, 8, 8),
        epochs=5000,
        early_stopping_patience=0,
        max_minutes=budget_s / 60,
    )
    spec.backend = "paddle"
    spec.save(workdir)
    started = time.monotonic()
    evaluation = runner.run(workdir)
    took = time.monotonic() - started

    full = 5000 * 4
    logs = [d for k, d in events if k == "log" and "message" in d]
    planned = [d for d in logs if "budget_steps" in d]
    assert len(planned) == 1, logs
    assert "epochs" in planned[0]["message"] and "s/step" in planned[0]["message"]
    assert 0 < planned[0]["budget_steps"] < full and planned[0]["step_s"] > 0
    # Planned again at each epoch's end from what was measured: within every epoch, not all.
    assert 0 < evaluation["steps"] < full
    stop = [d["message"] for d in logs if "training stopped at step" in d["message"]]
    assert len(stop) == 1, logs
    # Within the budget, with room for slow shared machines (the runner's start and export).
    assert took < budget_s + 20, took
    # The learning rate decayed to zero over the planned steps (unless the machine slowed down
    # past the plan and the time ran out first).
    losses = [d for k, d in events if k == "loss"]
    assert losses[-1]["step"] == evaluation["steps"]
    if "as planned" in stop[0]:
        assert losses[-1]["lr"] < spec.hp.learning_rate * 0.05
    best = json.loads((workdir / BEST / "state.json").read_text())["step"]
    assert best == evaluation["best_step"] <= evaluation["steps"]
    assert (workdir / "export" / "manifest.json").is_file()
    last = [d for k, d in events if k == "progress"][-1]
    assert last["step"] == last["total_steps"] == evaluation["steps"]

    # The checkpoint keeps what a resumed attempt needs: the seconds spent and the plan; a
    # job started again after its training ended trains no further.
    state = json.loads((workdir / CHECKPOINT / "state.json").read_text())
    assert state["planned_steps"] == evaluation["steps"]
    assert 0 < state["elapsed_s"] <= took
    events.clear()
    again = runner.run(workdir)
    assert again["steps"] == evaluation["steps"]
    assert [k for k, _ in events].count("loss") == 0


def _run_apart(workdir: Path) -> list[tuple[str, dict]]:
    """The runner in a process of its own, as the train worker starts it (a framework's names
    are per process: a resume is always a new one); its events."""
    done = subprocess.run(
        [sys.executable, "-m", "runtime.run", str(workdir)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = []
    for line in done.stdout.splitlines():
        if line.startswith(runner.EVENT_PREFIX):
            event = json.loads(line[len(runner.EVENT_PREFIX) :])
            event.pop("t")
            found.append((event.pop("kind"), event))
    return found


@pytest.mark.parametrize("preset", ["", "ngram-bag-char"])
def test_a_pause_asked_for_stops_at_the_epochs_end_and_the_next_run_resumes(
    tmp_path: Path, preset: str
) -> None:
    workdir, spec = make_workdir(
        tmp_path, "text_classification", sizes=(32, 8, 8), epochs=3, early_stopping_patience=0
    )
    spec.backend = "paddle"
    spec.preset = preset or spec.preset
    spec.save(workdir)
    (workdir / PAUSE_REQUEST).touch()  # asked before the first epoch ends: it ends it first
    events = _run_apart(workdir)
    per_epoch = 4
    assert ("paused", {"step": per_epoch, "epoch": 1}) in events
    assert json.loads((workdir / CHECKPOINT / "state.json").read_text())["step"] == per_epoch
    assert (workdir / BEST / "state.json").is_file()
    assert not (workdir / "export").exists()  # nothing exported: training is not over

    (workdir / PAUSE_REQUEST).unlink()
    events = _run_apart(workdir)
    assert ("resumed", {"step": per_epoch, "epoch": 1}) in events
    if preset:  # a fast model's wide part comes back from the checkpoint, not solved again,
        logs = [d["message"] for k, d in events if k == "log"]  # and its folds are held out
        assert "held-out wide logits of 5 folds" in logs, logs
        assert not any("wide part:" in m for m in logs), logs
        config = json.loads((workdir / BEST / "config.json").read_text("utf-8"))
        assert config["wide_buckets"] == 4096  # sized to 32 short rows' n-grams
    steps = [d["step"] for k, d in events if k == "loss"]
    assert min(steps) > per_epoch and max(steps) == 3 * per_epoch
    assert (workdir / "export" / "manifest.json").is_file()
