"""Compression on a CPU: one model trained on generated Chinese reviews by the job runner, then
compressed to INT8 by a job of objective "int8" (runtime.compress), FP32 against INT8 on the
same CPU in one run, each timed by the compression job itself (one thread, end to end per
row: tokenising, windows, the model, decoding).

    make bench      # or: .venv/bin/python benchmarks/compression.py [--rows N] [--preset P]
                    #     [--mode dynamic|static] [--smoke]

The FP32 baseline is the parent as it is served (Paddle Inference for a Paddle model); the
``*_vs_onnx`` figures compare with the parent's FP32 ONNX form in the same runtime as INT8.
The same model is also distilled (runtime.distill) into a student preset (``--student``,
the small transformer by default), timed against the teacher as served.
Aim (issue "Train once, deploy many"): INT8 at least 1.5× faster at batch 1 and batch 32,
at most 1 point less accurate, at most 0.3× the size; the student at least 3× faster than
its teacher at batch 32, within 2 points.

Ends with one JSON line: int8_speedup_b1, int8_speedup_b32, int8_accuracy_delta,
int8_size_ratio, student_speedup_b32, student_accuracy_delta, and the same against ONNX FP32.
"""

import argparse
import json
import shutil
from pathlib import Path

from _harness import (
    parse,
    print_result,
    review_rows,
    run_events,
    train_dev_test,
    workspace,
    write_splits,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--preset", default="ernie-tiny-char")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--mode", choices=["dynamic", "static"], default="dynamic")
    parser.add_argument("--student", default="ernie-micro-char")
    parser.add_argument("--student-epochs", type=int, default=0, help="default: the preset's")
    args = parse(
        parser,
        smoke={"rows": 200, "epochs": 1, "preset": "ernie-micro-char", "student_epochs": 1},
    )

    from runtime.presets import recommended
    from runtime.spec import JobSpec

    rows = review_rows(args.rows, filler=(4, 24))  # one window each: the model, not windows
    labels = sorted({r["label"] for r in rows})
    n = len(rows)
    hp = recommended("text_classification", preset=args.preset)
    hp.epochs, hp.learning_rate, hp.max_seq_length = args.epochs, args.learning_rate, 32
    hp.early_stopping_patience = 0
    with workspace("compression-") as tmp:
        trained = Path(tmp) / "trained"
        write_splits(trained, train_dev_test(rows))
        spec = JobSpec(
            job_id=1,
            task_kind="text_classification",
            labels=labels,
            preset=args.preset,
            hyperparameters=hp,
        )
        spec.save(trained)
        run_events(trained, timeout=3600)

        compressed = Path(tmp) / "compressed"
        shutil.copytree(trained / "data", compressed / "data")
        for part in ("export", "targets"):
            shutil.copytree(trained / part, compressed / "parent" / part)
        spec.objective = "int8"
        spec.hp.quantization = args.mode
        spec.save(compressed)
        run_events(compressed, timeout=3600)
        figures = json.loads((compressed / "evaluation.json").read_text("utf-8"))["compression"]

        distilled = Path(tmp) / "distilled"
        shutil.copytree(trained / "data", distilled / "data")
        shutil.copytree(trained / "export", distilled / "parent" / "export")
        spec.objective, spec.preset = "distill", args.student
        spec.hyperparameters = recommended("text_classification", preset=args.student)
        spec.hp.max_seq_length = 32
        if args.student_epochs:
            spec.hp.epochs = args.student_epochs
        spec.save(distilled)
        run_events(distilled, timeout=3600)
        student = json.loads((distilled / "evaluation.json").read_text("utf-8"))["compression"]

    latency, size = figures["latency"], figures["size"]
    int8, served, onnx = latency["model"], latency["parent"], latency["parent_onnx"]
    delta = figures["metric_delta"]["accuracy"]
    print(
        f"{args.preset}, {n} rows, int8-{args.mode}: batch 1 {served['b1_ms']} → "
        f"{int8['b1_ms']} ms (ONNX FP32 {onnx['b1_ms']}), batch 32 "
        f"{served['b32_rows_per_s']} → {int8['b32_rows_per_s']} rows/s "
        f"(ONNX FP32 {onnx['b32_rows_per_s']}), size {size['parent']} → {size['model']} bytes, "
        f"accuracy {delta:+.4f}, agreement {figures['agreement']}"
    )
    print(
        f"student {args.student}: batch 32 {student['latency']['model']['b32_rows_per_s']} rows/s"
        f" (teacher {student['latency']['parent']['b32_rows_per_s']}), accuracy "
        f"{student['metric_delta']['accuracy']:+.4f}, agreement {student['agreement']}"
    )
    print_result(
        {
            "int8_speedup_b1": round(served["b1_ms"] / int8["b1_ms"], 3),
            "int8_speedup_b32": round(int8["b32_rows_per_s"] / served["b32_rows_per_s"], 3),
            "int8_accuracy_delta": delta,
            "int8_size_ratio": round(size["model"] / size["parent"], 4),
            "student_speedup_b32": round(
                student["latency"]["model"]["b32_rows_per_s"]
                / student["latency"]["parent"]["b32_rows_per_s"],
                3,
            ),
            "student_accuracy_delta": student["metric_delta"]["accuracy"],
            "student_speedup_b1": round(
                student["latency"]["parent"]["b1_ms"] / student["latency"]["model"]["b1_ms"], 3
            ),
            "student_size_ratio": round(student["size"]["model"] / student["size"]["parent"], 4),
            "student": args.student,
            "int8_speedup_b1_vs_onnx": round(onnx["b1_ms"] / int8["b1_ms"], 3),
            "int8_speedup_b32_vs_onnx": round(int8["b32_rows_per_s"] / onnx["b32_rows_per_s"], 3),
            "int8_size_ratio_vs_onnx": round(size["model"] / size["parent_onnx"], 4),
            "agreement": figures["agreement"],
            "preset": args.preset,
            "mode": args.mode,
            "rows": n,
        }
    )


if __name__ == "__main__":
    main()
