"""Data by the real import path (upload, import job, pipeline): CSV and JSONL versions,
a reviews dataset, and rows whose label a keyword decides for each task kind. The benchmarks
use the upload and import steps too."""

from __future__ import annotations

import csv
import io
import json
import random
import time

POS, NEG = ["很好", "满意", "喜欢", "推荐", "不错"], ["很差", "失望", "讨厌", "退货", "糟糕"]
FILLER = "这个产品的质量和服务总体来说"
REVIEW_LABELS = ["正面", "负面"]


def csv_data(rows: list[list[str]], encoding: str = "utf-8", delimiter: str = ",") -> bytes:
    """``rows`` (the header first) as the bytes of a CSV file."""
    buf = io.StringIO()
    csv.writer(buf, delimiter=delimiter, lineterminator="\n").writerows(rows)
    return buf.getvalue().encode(encoding)


def upload_data(owner, team, data: bytes, fmt: str = "csv"):
    """``data`` uploaded in one chunk, as the console's uploader sends a small file."""
    from labeling.datasets import upload_create, upload_write_chunk

    upload = upload_create(actor=owner, team=team, filename=f"d.{fmt}", size=len(data))
    upload_write_chunk(upload=upload, offset=0, stream=io.BytesIO(data), length=len(data))
    upload.refresh_from_db()
    return upload


def start_import(owner, dataset, upload, mapping: dict, fmt: str = "csv"):
    """The import job of a UTF-8 ``upload`` into ``dataset`` (queued, or run where Celery is
    eager)."""
    from labeling.imports import import_start

    options = {"mapping": mapping}
    return import_start(
        actor=owner, dataset=dataset, upload=upload, fmt=fmt, encoding="utf-8", options=options
    )


def import_file(dataset, owner, data: bytes, fmt: str = "csv", mapping: dict | None = None):
    """Upload ``data`` and import it by the real path (upload, import job, pipeline); the job
    when it has finished."""
    from django.db import connection

    from labeling import task_kinds
    from labeling.imports import import_run

    upload = upload_data(owner, dataset.team, data, fmt)
    if mapping is None:
        header = data.decode().splitlines()[0].split(",")
        mapping = task_kinds.get(dataset.task_kind).propose_mapping(header)
    job = start_import(owner, dataset, upload, mapping, fmt)
    if connection.in_atomic_block:
        # A `db` test: on-commit callbacks never run, so run the import as the task would.
        return import_run(job.pk)
    # A transactional test: the import was queued at commit; the suite's worker runs it.
    deadline = time.monotonic() + 60
    while job.status not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, "the worker did not run the import"
        time.sleep(0.2)
        job.refresh_from_db()
    return job


def make_version(dataset, owner, rows: list[list[str]] | None = None):
    """A dataset version of CSV ``rows`` (header first), made by the real import path."""
    rows = rows or [["text", "label"], ["很好", "正面"], ["很差", "负面"], ["一般", "正面"]]
    job = import_file(dataset, owner, csv_data(rows))
    assert job.version is not None, job.error
    return job.version


def make_jsonl_version(dataset, owner, records: list[dict], mapping: dict):
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    job = import_file(dataset, owner, data, fmt="jsonl", mapping=mapping)
    assert job.version is not None, job.error
    return job.version


def reviews_dataset(team, owner, name: str = "评论", labels: list[str] | None = None):
    """A text-classification dataset of reviews, positive or negative (``labels``)."""
    from labeling.datasets import dataset_create

    return dataset_create(
        actor=owner,
        team=team,
        name=name,
        task_kind="text_classification",
        labels=labels or REVIEW_LABELS,
    )


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


def version_for(dataset, owner, n: int = 80):
    """A version of ``dataset`` made of ``n`` rows_for its task kind."""
    rows, mapping = rows_for(dataset.task_kind, n)
    return make_jsonl_version(dataset, owner, rows, mapping)
