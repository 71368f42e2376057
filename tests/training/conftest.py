import random
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import make_jsonl_version

POS, NEG = ["很好", "满意", "喜欢", "推荐", "不错"], ["很差", "失望", "讨厌", "退货", "糟糕"]
FILLER = "这个产品的质量和服务总体来说"


def rows_for(kind: str, n: int = 80, seed: int = 0) -> tuple[list[dict], dict]:
    """Rows whose label a keyword decides (a model learns them in a few epochs), and the
    mapping of their fields."""
    rng = random.Random(seed)
    rows: list[dict] = []
    if kind in ("instruction", "preference"):
        return _generative_rows(kind, n, rng)
    for i in range(n):
        positive = i % 2 == 0
        word = rng.choice(POS if positive else NEG)
        text = f"{FILLER[: rng.randint(3, 12)]}{word}{i}"
        if kind == "text_classification":
            rows.append({"text": text, "label": "正面" if positive else "负面"})
        elif kind == "multi_label":
            labels = ["好评" if positive else "差评"] + (["物流"] if i % 3 == 0 else [])
            rows.append({"text": text + ("物流快" if i % 3 == 0 else ""), "labels": labels})
        elif kind == "text_pair":
            rows.append(
                {
                    "text_a": text,
                    "text_b": rng.choice(POS if positive else NEG),
                    "label": "相似" if positive else "不相似",
                }
            )
        else:
            city = rng.choice(["北京", "上海", "广州", "深圳"])
            prefix = FILLER[: rng.randint(2, 8)]
            rows.append(
                {
                    "text": f"{prefix}{city}{word}",
                    "entities": [{"start": len(prefix), "end": len(prefix) + 2, "label": "地点"}],
                }
            )
    mapping = {f: f for f in rows[0]}
    return rows, mapping


def _generative_rows(kind: str, n: int, rng: random.Random) -> tuple[list[dict], dict]:
    """Sums in words ("3加4等于几？" → "3加4等于7。"): a tiny causal LM learns the answer's form
    in a few epochs, and DPO that the sum beats "不知道"."""
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    rng.shuffle(pairs)
    rows: list[dict] = []
    for a, b in (pairs * (n // len(pairs) + 1))[:n]:
        question, answer = f"{a}加{b}等于几？", f"{a}加{b}等于{a + b}。"
        if kind == "instruction":
            rows.append(
                {
                    "messages": [
                        {"role": "user", "content": question},
                        {"role": "assistant", "content": answer},
                    ]
                }
            )
        else:
            rows.append({"prompt": question, "chosen": answer, "rejected": "我不知道。"})
    return rows, {f: f for f in rows[0]}


@pytest.fixture
def make_dataset(team, owner):
    from labeling import services as labeling_services

    def make(kind: str = "text_classification", n: int = 80, name: str = ""):
        dataset = labeling_services.dataset_create(
            actor=owner, team=team, name=name or f"{kind}-{n}", task_kind=kind
        )
        rows, mapping = rows_for(kind, n)
        return make_jsonl_version(dataset, owner, rows, mapping)

    return make


def wait_for(job, statuses=("succeeded", "failed", "cancelled"), timeout: float = 180, until=None):
    deadline = time.monotonic() + timeout
    while True:
        job.refresh_from_db()
        if until(job) if until else job.status in statuses:
            return job
        assert time.monotonic() < deadline, (
            f"job {job.pk} is {job.status} ({job.phase}) after {timeout} s: {job.error}"
        )
        time.sleep(0.3)


def losses(job) -> dict[int, float]:
    """The job's training loss by step, as its runner reported it."""
    return {e.data["step"]: e.data["loss"] for e in job.events.filter(kind="loss")}


def log_of(job) -> str:
    """The job's log lines (its runner's output and the worker's notes), one text."""
    return "\n".join(e.data["message"] for e in job.events.filter(kind="log"))


def stored_model(team, owner, tmp_path: Path, **fields):
    """A model version with real files in storage (a made-up export), as a job leaves one."""
    from runtime.inference import write_manifest
    from training import storage

    export = tmp_path / "staged" / "export"
    export.mkdir(parents=True)
    (export / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n好\n", encoding="utf-8")
    (export / "model.onnx").write_bytes(b"\x08\x01 not really onnx")
    manifest = write_manifest(
        export,
        task_kind="text_classification",
        labels=["正面", "负面"],
        head="single",
        max_length=32,
        backend="torch",
        runtime="onnxruntime",
        model_file="model.onnx",
    )
    prefix = f"models/{uuid.uuid4().hex}/"
    files = storage.store_dir(tmp_path / "staged", prefix)
    from training.models import ModelVersion

    values = dict(
        team=team,
        name="reviews",
        number=1,
        task_kind="text_classification",
        labels=["正面", "负面"],
        backend="torch",
        runtime="onnxruntime",
        manifest=manifest,
        metrics={"accuracy": 0.9},
        storage_prefix=prefix,
        files=files,
        created_by=owner,
    )
    return ModelVersion.objects.create(**{**values, **fields})


@pytest.fixture(autouse=True)
def english():
    """Messages are asserted in English; the console's default language is Chinese."""
    from django.utils import translation

    with translation.override("en"):
        yield


@pytest.fixture
def client(client):
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "en"
    return client
