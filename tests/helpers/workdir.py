"""A job's workdir and spec for the runtime's tests, which run in the runtime venv without
Django: rows whose annotation a keyword decides, so that a tiny model from scratch learns
them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.spec import JobSpec

TOPIC_FILLER = "今天我们的这个那些很都也在说看到了一下还是"
TOPICS = {
    "体育": ["足球", "篮球", "比赛"],
    "财经": ["股票", "银行", "基金"],
    "科技": ["手机", "芯片", "电脑"],
}
PEOPLE, PLACES = ["张三", "李四", "王五", "赵六"], ["北京", "上海", "广州", "深圳"]
PAIR_LABELS = {"相关": "是的", "无关": "不对"}


def _filler(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(TOPIC_FILLER) for _ in range(n))


def topic_row(kind: str, rng: random.Random) -> dict:
    """A row whose annotation a keyword decides: a tiny model from scratch learns it."""
    if kind == "text_classification":
        label = rng.choice(list(TOPICS))
        text = (
            _filler(rng, rng.randint(1, 4))
            + rng.choice(TOPICS[label])
            + _filler(rng, rng.randint(1, 6))
        )
        return {"text": text, "label": label}
    if kind == "multi_label":
        labels = rng.sample(list(TOPICS), rng.randint(1, 2))
        text = _filler(rng, 2) + _filler(rng, 2).join(rng.choice(TOPICS[x]) for x in labels)
        return {"text": text + _filler(rng, 2), "labels": labels}
    if kind == "text_pair":
        label = rng.choice(list(PAIR_LABELS))
        text_a, text_b = (
            _filler(rng, rng.randint(3, 8)),
            _filler(rng, rng.randint(1, 3)) + PAIR_LABELS[label],
        )
        return {"text_a": text_a, "text_b": text_b, "label": label}
    person, place = rng.choice(PEOPLE), rng.choice(PLACES)
    head = _filler(rng, rng.randint(0, 2))
    middle = rng.choice(["昨天去了", "今天在", "说要去"])
    text = head + person + middle + place + _filler(rng, 2)
    p, q = len(head), len(head) + len(person) + len(middle)
    entities = [
        {"start": p, "end": p + 2, "label": "PER"},
        {"start": q, "end": q + 2, "label": "LOC"},
    ]
    return {"text": text, "entities": entities}


TOPIC_LABELS = {
    "text_classification": list(TOPICS),
    "multi_label": list(TOPICS),
    "text_pair": list(PAIR_LABELS),
    "ner": ["PER", "LOC"],
}


def make_workdir(root: Path, kind: str, *, sizes=(96, 16, 24), **hp) -> tuple[Path, JobSpec]:
    """A job's workdir of topic_row rows (train, dev, test of ``sizes``) and its spec for the
    torch backend (the runtime's tests, without Django)."""
    from runtime.spec import Hyperparameters, JobSpec

    rng = random.Random(kind)
    workdir = root / kind
    (workdir / "data").mkdir(parents=True)
    for split, n in zip(("train", "dev", "test"), sizes, strict=True):
        rows = [topic_row(kind, rng) for _ in range(n)]
        (workdir / "data" / f"{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
        )
    values = {
        "epochs": 10,
        "batch_size": 8,
        "learning_rate": 2e-3,
        "max_seq_length": 32,
        "warmup_ratio": 0.1,
        "checkpoint_steps": 0,
        **hp,
    }
    spec = JobSpec(
        job_id=1,
        task_kind=kind,
        labels=TOPIC_LABELS[kind],
        backend="torch",
        preset="ernie-micro-char",
        hyperparameters=Hyperparameters(**values),
    )
    spec.save(workdir)
    return workdir, spec


def lora_workdir(directory: Path, kind: str, rows: list[dict], backend: str, base: Path) -> Path:
    """A LoRA fine-tuning of the base model in ``base`` on ``rows`` (the last 8 the dev split),
    two epochs: its workdir, for the runner."""
    from runtime.spec import Hyperparameters, JobSpec

    data = directory / "data"
    data.mkdir(parents=True)
    for split, part in (("train", rows[:-8]), ("dev", rows[-8:])):
        (data / f"{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part), "utf-8"
        )
    hp = Hyperparameters(
        epochs=2,
        batch_size=8,
        learning_rate=1e-2,
        max_seq_length=128,  # Qwen2's template adds its default system prompt
        checkpoint_steps=0,
        eval_generations=0,
        method="lora",
    )
    JobSpec(
        job_id=1,
        task_kind=kind,
        labels=[],
        backend=backend,
        base_model_dir=str(base),
        hyperparameters=hp,
    ).save(directory)
    return directory


def run_quietly(workdir: Path) -> None:
    """The job runner on ``workdir`` in this process (the runtime venv's), its events unsent:
    for fixtures that share one trained model among their tests."""
    import pytest

    import runtime.run as runner

    mp = pytest.MonkeyPatch()
    mp.setattr(runner, "emit", lambda *a, **k: None)
    try:
        runner.run(workdir)
    finally:
        mp.undo()
