"""Model quality on a CPU: the default preset of a task kind against the classical baseline,
trained on the same rows and scored on the same test split in one run, by the job runner
(``python -m runtime.run`` in .venv-runtime: the report's ``comparison`` is the platform's own).

    make bench      # or: .venv/bin/python benchmarks/quality.py [--rows N] [--kind K] [--smoke]
    .venv/bin/python benchmarks/quality.py --file reviews.csv   # text,label (UTF-8 or GBK)
    .venv/bin/python benchmarks/quality.py --file ner.jsonl     # {"text", "entities"} rows
    .venv/bin/python benchmarks/quality.py --file reviews.csv --folds 5   # 5 runs, turned

The generated corpus has a known signal that no single keyword gives away: a review holds
three to six opinion words, each possibly negated (不/没有), its label is the sign of their
sum, and 5% of the labels are flipped; NER rows (``--kind ner``) hold names and places amid
common characters. Every default applies (the preset of a CPU node, its recommended
hyperparameters, early stopping) except where an argument says otherwise. Splits are 0.8/0.1/
0.1 in a seeded order. Aim: the model at or above the baseline, trained in under 10 minutes on
two cores for 20 k rows.

Ends with one JSON line: model_metric, baseline_metric, ratio (model / baseline), train_s (the
job's building, a fast model's wide part solved, and training), baseline_train_s, metric,
preset, rows. With ``--folds K`` (K runs, the rows turned by 1/K each, so each tests other
rows) the figures are means, and the line adds
each run's model_metrics and baseline_metrics, difference_mean, difference_stdev and
model_wins: one split's test rows cannot tell apart differences of half a percent.
"""

import argparse
import csv
import io
import json
import random
import statistics
import sys
from pathlib import Path

from _harness import CHARS, parse, print_result, run_events, train_dev_test, workspace, write_splits

POSITIVE = ["满意", "喜欢", "推荐", "不错", "好用", "舒服", "划算", "结实", "漂亮", "实惠"]
NEGATIVE = ["失望", "糟糕", "退货", "难用", "后悔", "粗糙", "卡顿", "掉色", "异味", "太贵"]
NEGATIONS = ["不", "没有", "不太"]
PEOPLE = ["张伟", "王芳", "李娜", "刘洋", "陈静", "杨帆", "赵磊", "黄敏", "周杰", "吴昊"]
PLACES = ["北京", "上海", "广州", "深圳", "杭州", "成都", "武汉", "南京", "西安", "重庆"]


def _filler(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choices(CHARS, k=rng.randint(low, high)))


def reviews(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)  # noqa: S311 - reproducible test data
    rows = []
    for _ in range(n):
        score, parts = 0, []
        for _word in range(rng.randint(3, 6)):
            positive = rng.random() < 0.5
            negated = rng.random() < 0.3
            word = rng.choice(POSITIVE if positive else NEGATIVE)
            parts.append(_filler(rng, 2, 12) + (rng.choice(NEGATIONS) if negated else "") + word)
            score += (1 if positive else -1) * (-1 if negated else 1)
        if score == 0:
            score = 1 if rng.random() < 0.5 else -1
        label = "正面" if score > 0 else "负面"
        if rng.random() < 0.05:
            label = "负面" if label == "正面" else "正面"
        rows.append({"text": "".join(parts) + _filler(rng, 0, 8), "label": label})
    return rows


def ner_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)  # noqa: S311 - reproducible test data
    rows = []
    for _ in range(n):
        text, entities = _filler(rng, 0, 6), []
        for _entity in range(rng.randint(1, 3)):
            label = rng.choice(["人名", "地名"])
            word = rng.choice(PEOPLE if label == "人名" else PLACES)
            entities.append({"start": len(text), "end": len(text) + len(word), "label": label})
            text += word + _filler(rng, 2, 10)
        rows.append({"text": text, "entities": entities})
    return rows


def read_csv(path: Path) -> list[dict]:
    """text,label rows of a CSV file with a header, in UTF-8 or GBK."""
    raw = path.read_bytes()
    for encoding in ("utf-8-sig", "gb18030"):
        try:
            text = raw.decode(encoding)
            break
        except UnicodeDecodeError:
            continue
    else:
        sys.exit(f"{path}: neither UTF-8 nor GBK")
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or not {"text", "label"} <= set(reader.fieldnames):
        sys.exit(f"{path}: the header must name the columns text and label")
    rows = [{"text": r["text"], "label": r["label"]} for r in reader if r["text"] and r["label"]]
    random.Random(0).shuffle(rows)  # noqa: S311 - a seeded split
    return rows


def read_jsonl(path: Path) -> list[dict]:
    """NER rows of a JSON Lines file: {"text": ..., "entities": [{"start", "end", "label"}]}."""
    rows = []
    for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows.append({"text": row["text"], "entities": row["entities"]})
        except (ValueError, KeyError, TypeError) as e:
            sys.exit(f"{path}, line {number}: not a row of text and entities ({e})")
    random.Random(0).shuffle(rows)  # noqa: S311 - a seeded split
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--kind", choices=["text_classification", "ner"], default=None)
    parser.add_argument(
        "--file", type=Path, help="a CSV of text,label rows, or a .jsonl of NER rows, instead"
    )
    parser.add_argument("--preset", default="", help="default: the CPU default of the kind")
    parser.add_argument("--epochs", type=int, default=0, help="default: the preset's")
    parser.add_argument(
        "--folds",
        type=int,
        default=1,
        help="runs over the rows turned by 1/K each: mean and spread of the difference",
    )
    args = parse(parser, smoke={"rows": 400, "epochs": 2})

    from runtime.presets import default_preset, recommended

    kind = args.kind or "text_classification"
    if args.file and args.file.suffix == ".jsonl":
        rows, kind = read_jsonl(args.file)[: args.rows], "ner"
    elif args.file:
        rows, kind = read_csv(args.file)[: args.rows], "text_classification"
    else:
        rows = ner_rows(args.rows) if kind == "ner" else reviews(args.rows)
    if kind == "ner":
        labels = sorted({e["label"] for r in rows for e in r["entities"]} or {"人名", "地名"})
    else:
        labels = sorted({r["label"] for r in rows}, key=str)
    preset = args.preset or default_preset(kind)
    hp = recommended(kind, preset=preset)
    if args.epochs:
        hp.epochs = args.epochs
    n = len(rows)
    runs = []
    for k in range(args.folds):
        # Fold k: the rows turned by k/K of their number, so each run tests other rows.
        turned = rows[k * n // args.folds :] + rows[: k * n // args.folds]
        runs.append(run_once(turned, kind, labels, preset, hp))
        print(
            f"{kind}, {n} rows, {preset}, run {k + 1}/{args.folds}: {runs[-1]['metric']} "
            f"{runs[-1]['model']} vs {runs[-1]['name']} {runs[-1]['baseline']} "
            f"(majority {runs[-1]['majority']})",
            flush=True,
        )
    models = [r["model"] for r in runs]
    baseline_s = [r["baseline_train_s"] for r in runs if r["baseline_train_s"] is not None]
    baselines = [r["baseline"] for r in runs]
    figures = {
        "model_metric": round(statistics.mean(models), 6),
        "baseline_metric": round(statistics.mean(baselines), 6),
        "ratio": round(statistics.mean(models) / statistics.mean(baselines), 4)
        if all(baselines)
        else None,
        "train_s": round(statistics.mean(r["train_s"] for r in runs), 1),
        "baseline_train_s": round(statistics.mean(baseline_s), 3) if baseline_s else None,
        "metric": runs[0]["metric"],
        "preset": preset,
        "rows": n,
    }
    if args.folds > 1:  # the spread that tells a difference from the noise of one split
        differences = [m - b for m, b in zip(models, baselines, strict=True)]
        figures |= {
            "folds": args.folds,
            "model_metrics": models,
            "baseline_metrics": baselines,
            "difference_mean": round(statistics.mean(differences), 6),
            "difference_stdev": round(statistics.stdev(differences), 6),
            "model_wins": sum(d > 0 for d in differences),
        }
    print_result(figures)


def run_once(rows: list[dict], kind: str, labels: list[str], preset: str, hp) -> dict:
    """One job of the runner on ``rows`` cut 0.8/0.1/0.1: its comparison with the baselines."""
    from runtime.spec import JobSpec

    with workspace("quality-") as tmp:
        workdir = Path(tmp) / "job"
        write_splits(workdir, train_dev_test(rows))
        JobSpec(job_id=1, task_kind=kind, labels=labels, preset=preset, hyperparameters=hp).save(
            workdir
        )
        events = run_events(workdir, timeout=3600)
        evaluation = json.loads((workdir / "evaluation.json").read_text("utf-8"))
    states = [e for e in events if e["kind"] == "state" and "phase" in e]
    phases = {e["phase"]: e["t"] for e in states}
    # Building (the framework, the encoding, the model and its wide part's solve) is training.
    build_s = next((e.get("build_s", 0.0) for e in states if e["phase"] == "training"), 0.0)
    comparison = evaluation["comparison"]
    classical = evaluation["baselines"]["classical"]
    return {
        "model": comparison["model"],
        "baseline": comparison["baseline"],
        "majority": comparison["majority"],
        "metric": comparison["metric"],
        "name": classical.get("name"),
        "train_s": build_s + phases["exporting"] - phases["training"],
        "baseline_train_s": classical.get("train_s"),
    }


if __name__ == "__main__":
    main()
