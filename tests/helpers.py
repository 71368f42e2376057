"""Helpers the test modules share: making data by the real import path, starting workers,
waiting for a job or a condition, free ports, the browser tests' steps.

Fixtures live in the conftest modules; test modules import these functions from here, never
from a conftest. Nothing here imports Django at module level (each function imports what it
needs), so that the runtime venv's tests, which have no Django, may import this module too.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Page

ROOT = Path(__file__).resolve().parent.parent
POS, NEG = ["很好", "满意", "喜欢", "推荐", "不错"], ["很差", "失望", "讨厌", "退货", "糟糕"]
FILLER = "这个产品的质量和服务总体来说"
REVIEW_LABELS = ["正面", "负面"]


# -- Data, by the real import path -----------------------------------------------------------


def csv_data(rows: list[list[str]], encoding: str = "utf-8", delimiter: str = ",") -> bytes:
    """``rows`` (the header first) as the bytes of a CSV file."""
    buf = io.StringIO()
    csv.writer(buf, delimiter=delimiter, lineterminator="\n").writerows(rows)
    return buf.getvalue().encode(encoding)


def import_file(dataset, owner, data: bytes, fmt: str = "csv", mapping: dict | None = None):
    """Upload ``data`` and import it by the real path (upload, import job, pipeline); the job
    when it has finished."""
    from django.db import connection

    from labeling import task_kinds
    from labeling.datasets import upload_create, upload_write_chunk
    from labeling.imports import import_run, import_start

    upload = upload_create(actor=owner, team=dataset.team, filename=f"d.{fmt}", size=len(data))
    upload_write_chunk(upload=upload, offset=0, stream=io.BytesIO(data), length=len(data))
    upload.refresh_from_db()
    if mapping is None:
        header = data.decode().splitlines()[0].split(",")
        mapping = task_kinds.get(dataset.task_kind).propose_mapping(header)
    job = import_start(
        actor=owner,
        dataset=dataset,
        upload=upload,
        fmt=fmt,
        encoding="utf-8",
        options={"mapping": mapping},
    )
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


def stored_model(team, owner, tmp_path: Path, **fields):
    """A model version with real files in storage (a made-up export), as a job leaves one."""
    from runtime.inference import write_manifest
    from training import storage
    from training.models import ModelVersion

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


# -- Jobs --------------------------------------------------------------------------------------


def wait_for(job, statuses=("succeeded", "failed", "cancelled"), timeout: float = 180, until=None):
    """``job`` (any model with a status) once it is in one of ``statuses``, or once
    ``until(job)`` holds."""
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


# -- Workers -----------------------------------------------------------------------------------


def suite_database_url() -> str:
    """The URL of the test database, for processes the suite starts."""
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"


def start_worker(queues: str, name: str, pool: str = "solo", env: dict | None = None):
    """A real Celery worker on the suite's Redis and test database; returns once it answers."""
    command = ["-m", "celery", "-A", "console", "worker", "--queues", queues]
    command += ["--concurrency", "1", "--pool", pool, "--hostname", f"{name}@%h"]
    return _start([*command, "--loglevel", "WARNING"], name, env)


def start_train_worker(node: str, devices: str, env: dict | None = None, wait: bool = True):
    """A real train worker as `make run` starts it (``manage.py train_worker``): a node of its
    own, with declared devices (PLATFORM_DEVICES: ``npu:2`` runs on the CPU underneath)."""
    # Beating every second: a transactional test's flush deletes the node's row, and the next
    # beat registers it again.
    env = {
        "PLATFORM_NODE_NAME": node,
        "PLATFORM_DEVICES": devices,
        "PLATFORM_NODE_HEARTBEAT_S": "1",
        **(env or {}),
    }
    command = ["manage.py", "train_worker", "--loglevel", "WARNING"]
    return _start(command, f"train@{node}", env, wait)


def _start(command: list[str], name: str, env: dict | None, wait: bool = True):
    """Start a worker; unless `wait` is False (a worker on another Redis than the suite's),
    return once it answers on the suite's Redis."""
    from console.health import check_workers

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": suite_database_url(),
        **(env or {}),
    }
    proc = subprocess.Popen([sys.executable, *command], cwd=ROOT, env=env)
    if not wait:
        return proc
    deadline = time.monotonic() + 60
    while name not in check_workers(timeout=1).detail:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(
                f"the Celery worker {name} did not come up (is Redis at REDIS_URL running?)"
            )
    return proc


def stop_worker(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class SmallDisk:
    """A tmpfs of a few megabytes mounted for one test: a disk that can be filled up."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ballast = path / "ballast"

    def fill(self) -> None:
        """Write until the disk is full (ENOSPC), leaving no free block."""
        with open(self.ballast, "ab") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        # Smaller writes may still fit in the last partial block: fill it byte by byte.
        with open(self.ballast, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 512)
            except OSError:
                pass

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)


# -- Browser tests -----------------------------------------------------------------------------


def login(page: Page, username: str, password: str) -> None:
    page.goto("/login/")
    page.get_by_label("用户名").fill(username)
    page.get_by_label("密码").fill(password)
    page.get_by_role("button", name="登录").click()


def shot(page: Page, name: str) -> None:
    """A screenshot of the page, where E2E_SCREENSHOTS names a folder."""
    if os.environ.get("E2E_SCREENSHOTS"):
        page.screenshot(
            path=os.path.join(os.environ["E2E_SCREENSHOTS"], f"{name}.png"), full_page=True
        )


def wait_endpoint_ready(page: Page, timeout: float = 90) -> None:
    """Beat's reconciler, as it runs every 10 s, until the endpoint page says ready."""
    from deployment.reconcile import endpoints_reconcile

    state = page.get_by_test_id("endpoint-state")
    deadline = time.monotonic() + timeout
    while state.get_attribute("data-state") != "ready":
        assert time.monotonic() < deadline, state.get_attribute("data-state")
        endpoints_reconcile()
        time.sleep(0.5)
        page.reload()
