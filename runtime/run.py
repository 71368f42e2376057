"""The job runner: ``python -m runtime.run <workdir>``.

A child process of the train worker's Celery task, started in the runtime venv (Paddle, torch),
without Django: it reads ``spec.json`` and the data in the work directory, trains with the
job's backend (resuming from its checkpoint), exports the inference artifact with its manifest,
evaluates that artifact on the test split, and reports on stdout. A line that starts with
``@@event`` is a structured event (JSON); every other line is a log line.

A job on several devices runs under Paddle's launcher (``python -m paddle.distributed.launch
--nproc_per_node N runtime/run.py <workdir>``): every process trains, the first reports.
"""

import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

EVENT_PREFIX = "@@event "
EXAMPLES = 20  # test rows kept with their predictions in the report (an edge bundle's check)


def process_rank() -> int:
    """This process's rank in a multi-device job (Paddle's launcher, torchrun); 0 alone."""
    return int(os.environ.get("PADDLE_TRAINER_ID") or os.environ.get("RANK") or 0)


def emit(kind: str, **data) -> None:
    line = json.dumps({"kind": kind, "t": time.time(), **data}, ensure_ascii=False, default=str)
    sys.stdout.write(EVENT_PREFIX + line + "\n")
    sys.stdout.flush()


def run(workdir: Path) -> dict:
    from runtime.backends import get_backend
    from runtime.data import OBJECTIVES, LabelSpace, model_input
    from runtime.inference import write_manifest
    from runtime.kinds import GENERATIVE_KINDS
    from runtime.spec import JobSpec

    spec = JobSpec.load(workdir)
    if spec.visibility_env and not process_rank():
        # What this process sees: the job's own cards only (set by the train worker).
        seen = os.environ.get(spec.visibility_env, "")
        print(f"devices: {spec.device} via {spec.visibility_env}={seen}")
    if spec.objective == "evaluate":  # a version scored on an evaluation set
        from runtime.llm_eval import run_evaluation

        return run_evaluation(spec, workdir, emit)
    if spec.objective == "int8":  # compression of a trained model (runtime.compress)
        from runtime.compress import run_compression

        return run_compression(spec, workdir, emit)
    distilled = None
    if spec.objective == "distill":  # the teacher labels the rows first (runtime.distill)
        from runtime.distill import teacher_labels

        distilled = teacher_labels(spec, workdir, emit)
    emit("state", phase="loading")
    backend = get_backend(spec.backend)
    state = backend.train(spec, workdir, emit) or {}
    if process_rank():
        return {}  # a multi-device job: the first process exports and evaluates
    if spec.objective == "mlm":  # pretraining (runtime.mlm): best/ is the result, no export
        return _generative_evaluation(workdir, state)

    emit("state", phase="exporting")
    export = workdir / "export"
    tmp = workdir / "export.new"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    files = backend.export(spec, workdir, tmp)
    if spec.task_kind in GENERATIVE_KINDS:
        write_manifest(
            tmp,
            task_kind=spec.task_kind,
            objective=OBJECTIVES[spec.task_kind],
            labels=[],
            backend=spec.backend,
            runtime=backend.generative_runtime,
            max_length=spec.hp.max_seq_length,
            tokenizer={"type": "chat", "file": "tokenizer.json"},
            **files,
        )
        shutil.rmtree(export, ignore_errors=True)
        tmp.rename(export)
        return _generative_evaluation(workdir, state)
    space = LabelSpace(spec.task_kind, tuple(spec.labels))
    write_manifest(
        tmp,
        task_kind=spec.task_kind,
        labels=list(space.labels),
        head=space.head,
        tags=list(space.tags) if space.head == "token" else [],
        threshold=spec.hp.threshold,
        max_length=spec.hp.max_seq_length,
        backend=spec.backend,
        runtime=backend.runtime,
        **files,
    )
    shutil.rmtree(export, ignore_errors=True)
    tmp.rename(export)

    emit("state", phase="evaluating")
    evaluation, rows, preds = evaluate_export(spec, workdir, export)
    evaluation.update(
        history=state.get("history", []),
        best_step=state.get("best_step"),
        steps=state.get("step"),
        train_samples_per_s=state.get("samples_per_s"),
    )
    report = evaluation["metrics"]
    if rows:
        evaluation.update(_baselines(spec.task_kind, list(space.labels), workdir, rows, report))
    evaluation["targets"] = _targets(export, workdir, rows, preds)
    if distilled is not None:
        from runtime.distill import distillation_report

        evaluation["compression"] = distillation_report(
            spec, workdir, (rows, preds, report), distilled
        )
    # What an edge bundle checks itself against: the first test inputs and the export's
    # predictions for them.
    evaluation["examples"] = [
        {"input": model_input(spec.task_kind, row), "output": pred}
        for row, pred in zip(rows[:EXAMPLES], preds, strict=False)
    ]
    (workdir / "evaluation.json").write_text(
        json.dumps(evaluation, ensure_ascii=False, indent=1), encoding="utf-8"
    )
    summary = {k: v for k, v in report.items() if isinstance(v, int | float)}
    emit("metrics", step=state.get("step"), split=evaluation["split"], metrics=summary)
    return evaluation


def evaluate_export(spec, workdir: Path, export: Path) -> tuple[dict, list[dict], list[dict]]:
    """The export scored on the test split (dev when there is none), as the report has it;
    with the rows and its predictions."""
    from runtime.data import is_long
    from runtime.inference import Predictor
    from runtime.loop import load_split
    from runtime.metrics import evaluate

    split = "test"
    rows = load_split(workdir, "test", spec.task_kind)
    if not rows:
        split, rows = "dev", load_split(workdir, "dev", spec.task_kind)
    predictor = Predictor.load(export)
    started = time.perf_counter()
    preds = predictor.predict(rows)
    elapsed = time.perf_counter() - started
    labels = list(predictor.space.labels)
    report = evaluate(spec.task_kind, labels, rows, preds) if rows else {}
    # Rows longer than the model reads at once: predicted over overlapping windows (a text pair
    # is still cut), which the model page says.
    max_length = spec.hp.max_seq_length
    long_rows = sum(is_long(spec.task_kind, row, max_length) for row in rows)
    max_chars = max_length - (3 if spec.task_kind == "text_pair" else 2)
    if long_rows:
        emit(
            "log",
            message=f"{long_rows} of {len(rows)} {split} rows are longer than the maximum length"
            f" ({max_chars} characters)",
        )
    mistakes = [
        {"row": row, "predicted": pred}
        for row, pred in zip(rows, preds, strict=True)
        if _wrong(spec.task_kind, row, pred)
    ][:50]
    evaluation = {
        "split": split,
        "rows": len(rows),
        "metrics": report,
        "mistakes": mistakes,
        "inference_rows_per_s": round(len(rows) / elapsed, 1) if rows and elapsed else None,
        "long_rows": long_rows,
        "max_chars": max_chars,
    }
    return evaluation, rows, preds


def _baselines(kind: str, labels: list[str], workdir: Path, rows: list[dict], report: dict) -> dict:
    """The majority guess and a classical model trained on the train split and scored on the
    rows the model was (runtime.baselines); whatever goes wrong there, the report is written."""
    from runtime.loop import load_split

    try:
        from runtime.baselines import compare, run_baselines

        emit("state", phase="baselines")
        baselines = run_baselines(kind, labels, load_split(workdir, "train", kind), rows)
        comparison = compare(kind, report, baselines)
    except Exception as exc:
        print(f"baselines: {type(exc).__name__}: {exc}")
        return {}

    def fmt(x: float | None) -> str:
        return "–" if x is None else f"{x:.4f}"

    classical = baselines["classical"]
    verdict = "beats" if comparison["beats_baseline"] else "does NOT beat"
    failed = f" ({classical['error']})" if "error" in classical else ""
    emit(
        "log",
        message=f"{comparison['metric']}: model {fmt(comparison['model'])} {verdict} the baseline"
        f" {classical['name']} {fmt(comparison['baseline'])}{failed},"
        f" majority {fmt(comparison['majority'])}",
    )
    return {"baselines": baselines, "comparison": comparison}


def _targets(export: Path, workdir: Path, rows: list[dict], preds: list[dict]) -> dict:
    """The export's other targets (runtime.targets) in ``targets/``, each checked on the
    report's rows; one that fails says why and the job goes on."""
    from runtime.targets import TARGETS_DIR, make_targets

    results = make_targets(export, workdir / TARGETS_DIR, rows, preds)
    for target, result in results.items():
        if result["status"] == "failed":
            emit("log", message=f"target {target} failed: {result['error']}")
        else:
            emit("log", message=f"target {target}: agrees on {result['agreement']} of the rows")
    return results


def _generative_evaluation(workdir: Path, state: dict) -> dict:
    """A causal LM was evaluated by the loop on its best weights (loss, perplexity or
    preference accuracy, generations with ROUGE-L); this adds the run's figures and writes it."""
    evaluation = {
        **state["evaluation"],
        "history": state.get("history", []),
        "best_step": state.get("best_step"),
        "steps": state.get("step"),
        "train_samples_per_s": state.get("samples_per_s"),
        "peak_memory_mb": state.get("peak_memory_mb"),
    }
    (workdir / "evaluation.json").write_text(
        json.dumps(evaluation, ensure_ascii=False, indent=1), encoding="utf-8"
    )
    summary = {k: v for k, v in evaluation["metrics"].items() if isinstance(v, int | float)}
    emit("metrics", step=state.get("step"), split=evaluation["split"], metrics=summary)
    return evaluation


def _wrong(kind: str, row: dict, pred: dict) -> bool:
    if kind == "ner":
        gold = {(e["start"], e["end"], e["label"]) for e in row.get("entities") or []}
        return gold != {(e["start"], e["end"], e["label"]) for e in pred["entities"]}
    if kind == "multi_label":
        return set(row["labels"]) != set(pred["labels"])
    return row["label"] != pred["label"]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m runtime.run <workdir>", file=sys.stderr)
        return 2
    from runtime.loop import Paused

    try:
        run(Path(argv[0]))
    except Paused as paused:
        # Asked to stop (the team's device-hour quota): the checkpoint is kept for the resume.
        if not process_rank():
            emit("paused", step=paused.step, epoch=paused.epoch)
        return 0
    except Exception as exc:
        traceback.print_exc()
        sys.stderr.flush()
        emit("error", message=f"{type(exc).__name__}: {exc}")
        return 1
    emit("state", phase="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
