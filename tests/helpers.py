"""Helpers the test modules share: making data by the real import path, Label Studio
annotations, base models on disk, the URLconf's routes and an object for each URL argument,
starting workers, waiting for a job or a condition, the serving host's management calls, the
browser tests' steps. The benchmarks use the upload and import steps too.

Fixtures live in the conftest modules; test modules import these functions from here, never
from a conftest. Nothing here imports Django at module level (each function imports what it
needs), so that the runtime venv's tests, which have no Django, may import this module too.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

    from runtime.spec import JobSpec

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


# -- A job's workdir, for the runtime's tests ----------------------------------------------

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


# -- Label Studio ----------------------------------------------------------------------------

needs_label_studio = pytest.mark.skipif(
    not os.environ.get("LABEL_STUDIO_URL") and not os.environ.get("CI"),
    reason="Label Studio tests skipped: LABEL_STUDIO_URL is not set (run them with `make test`)",
)
# Three reviews for annotators to label (header first).
UNLABELED_REVIEWS = [["text", "label"], ["房间干净", ""], ["早餐很差", ""], ["服务热情", ""]]


def push_project(owner, version, name: str, **options):
    """A labeling project of ``version``, made and pushed to Label Studio (what the Celery task
    does)."""
    from labeling.projects import labeling_project_create, labeling_project_push

    created = labeling_project_create(actor=owner, version=version, name=name, **options)
    return labeling_project_push(created.pk)


def reviews_project(team, owner, name: str, dataset_name: str = "评论", **options):
    """A pushed labeling project of UNLABELED_REVIEWS in a new reviews dataset."""
    version = make_version(reviews_dataset(team, owner, dataset_name), owner, UNLABELED_REVIEWS)
    return push_project(owner, version, name, **options)


def task_ids(project) -> dict[int, int]:
    """The Label Studio task id of each row of ``project``."""
    return dict(project.tasks.values_list("row", "ls_task_id"))


def region(from_name: str, to_name: str, kind: str, value: dict) -> dict:
    """One region of an annotation's result, as Label Studio's API takes it."""
    return {"from_name": from_name, "to_name": to_name, "type": kind, "value": value}


def choice(label: str) -> list[dict]:
    """An annotation's result choosing ``label`` (the classification label config)."""
    return [region("label", "text", "choices", {"choices": [label]})]


def member_account(team, user) -> int:
    """The Label Studio user id of ``user``'s account, ``user`` being a labeling member of
    ``team`` (made through the team's service account: quicker than the console's hand-over).
    Only annotations by such accounts count; the tests annotate as them (``completed_by``)."""
    from labeling import label_studio
    from labeling.models import LabelStudioAccount

    account = LabelStudioAccount.objects.filter(user=user).first()
    if account is not None:
        return account.ls_user_id
    tag = f"{user.username}-{uuid.uuid4().hex[:8]}"
    person = label_studio.client(team).users.create(username=tag, email=f"{tag}@example.com")
    LabelStudioAccount.objects.create(
        user=user, ls_user_id=person.id, email=person.email, active_team=team
    )
    return person.id


def annotate(team, user, task_id: int, result: list[dict]) -> None:
    """``user`` annotates Label Studio task ``task_id`` with ``result``."""
    from labeling import label_studio

    label_studio.client(team).annotations.create(
        id=task_id, completed_by=member_account(team, user), result=result
    )


# -- Base models on disk, made in the runtime venv ---------------------------------------------

# The characters of the reviews the tests train on: the vocabulary of the models made here.
CHARS = FILLER + "".join(POS + NEG) + "北京上海广州深圳物流快0123456789"
_MAKE_ENCODER = """
import json, pathlib, sys
from {package} import {name}Config, {name}Model
from runtime.tokenizer import CharTokenizer
d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True)
tok = CharTokenizer.build([sys.argv[2]])
tok.save(d / "vocab.txt")
{name}Model({name}Config(vocab_size=len(tok.vocab), hidden_size=64, num_hidden_layers=2,
           num_attention_heads=2, intermediate_size=128)).save_pretrained(str(d))
"""
# An ERNIE in PaddleNLP layout, and a BERT in Hugging Face layout (argv: directory, chars).
MAKE_PADDLE = _MAKE_ENCODER.format(package="paddlenlp.transformers", name="Ernie") + (
    '(d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "ErnieTokenizer"}))\n'
)
MAKE_HF = _MAKE_ENCODER.format(package="transformers", name="Bert")
# A tiny LLaMA of either backend (argv: directory, backend).
MAKE_LLM = """
import pathlib, sys
from runtime.chat import build_char_tokenizer
d = pathlib.Path(sys.argv[1]); backend = sys.argv[2]
chars = "0123456789加等于几？。我不知道userassistantsystem"
tok = build_char_tokenizer([chars], d)
arch = dict(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=172, max_position_embeddings=512,
            tie_word_embeddings=False, initializer_range=0.2, pad_token_id=0)
if backend == "paddle":
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM
    LlamaForCausalLM(LlamaConfig(use_flash_attention=False, **arch)).save_pretrained(str(d))
else:
    from transformers import LlamaConfig, LlamaForCausalLM
    LlamaForCausalLM(LlamaConfig(**arch)).save_pretrained(str(d))
"""


def in_runtime(
    script: str, *args: str, env: dict | None = None, stdin: str = "", timeout: float = 180
) -> str:
    """Run ``script`` with the runtime venv's Python (Paddle, torch, transformers), the project
    on its path and only ``env`` besides; its output."""
    from django.conf import settings

    proc = subprocess.run(
        [str(settings.TRAINING_PYTHON), "-c", script, *args],
        input=stdin,
        cwd=settings.BASE_DIR,
        env={"PATH": "/usr/bin:/bin", **(env or {}), "PYTHONPATH": str(settings.BASE_DIR)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def model_dir(script: str, name: str, *args: str, env: dict | None = None) -> Path:
    """The directory ``name`` under the server's import directory, made by ``script`` (argv:
    the directory, ``args``) unless an earlier session made it."""
    from django.conf import settings

    target = settings.MODEL_IMPORT_DIR / name
    if not target.exists():
        in_runtime(script, str(target), *args, env=env)
    return target


# -- Routes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    name: str
    kwargs: tuple[str, ...]
    path: str

    @property
    def team_scoped(self) -> bool:
        return "team" in self.kwargs

    @property
    def is_api(self) -> bool:
        return self.path.startswith("api/")


def iter_routes(
    patterns=None, namespace: str = "", kwargs: tuple = (), prefix: str = ""
) -> Iterator[Route]:
    from django.urls import URLPattern, URLResolver, get_resolver

    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        names = kwargs + tuple(entry.pattern.converters)
        path = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            ns = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from iter_routes(entry.url_patterns, ns, names, path)
        elif isinstance(entry, URLPattern) and entry.name:
            yield Route(f"{namespace}{entry.name}", names, path)


def routes() -> list[Route]:
    """Every named route of the URLconf, by name."""
    return sorted(set(iter_routes()), key=lambda r: r.name)


def object_factories(team, owner) -> dict:
    """How to make, in `team`, the object that each URL argument names."""
    from console import services
    from console.models import Membership
    from labeling.datasets import dataset_create, upload_create
    from labeling.projects import labeling_project_create
    from training.jobs import training_job_submit
    from training.models import BaseModel, ModelVersion

    def version():
        dataset = dataset_create(actor=owner, team=team, name="ds", task_kind="text_classification")
        return make_version(dataset, owner)

    v = version()
    job = training_job_submit(actor=owner, team=team, dataset_version=v)
    base = BaseModel.objects.create(
        team=team, name="base", backend="paddle", architecture="ernie", storage_prefix="x/"
    )
    model_version = ModelVersion.objects.create(
        team=team,
        name="ds",
        number=1,
        job=job,
        dataset_version=v,
        task_kind="text_classification",
        backend="paddle",
        runtime="paddle_inference",
        storage_prefix="y/",
    )
    upload = upload_create(actor=owner, team=team, filename="x.csv", size=10)
    from deployment.models import Endpoint, EndpointKey, Revision

    endpoint = Endpoint.objects.create(
        team=team, name=f"ep-{team.slug}", task_kind="text_classification"
    )
    revision = Revision.objects.create(endpoint=endpoint, number=1, model_version=model_version)
    endpoint_key = EndpointKey.objects.create(
        endpoint=endpoint, name="k", prefix="mpe_x", key_hash=f"hash-{team.slug}"
    )
    return {
        "team": lambda: team.slug,
        "membership_id": lambda: Membership.objects.filter(team=team).first().pk,
        "token_id": lambda: services.api_token_create(actor=owner, name="t")[0].pk,
        "dataset_id": lambda: v.dataset_id,
        "number": lambda: v.number,
        "job_id": lambda: v.lineage["import_job"],
        "upload_id": lambda: upload.pk,
        "kind": lambda: "original",
        "user_id": lambda: owner.pk,
        "project_id": lambda: labeling_project_create(actor=owner, version=v, name="p").pk,
        "training_job_id": lambda: job.pk,
        "base_model_id": lambda: base.pk,
        "model_version_id": lambda: model_version.pk,
        "endpoint_id": lambda: endpoint.pk,
        "revision_id": lambda: revision.pk,
        "endpoint_key_id": lambda: endpoint_key.pk,
    }


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


# -- The serving host's management API ------------------------------------------------------

KEY = "mpe_test-key-0123456789"
KEY_HASH = hashlib.sha256(KEY.encode()).hexdigest()


def load(host, key: str, export, **config) -> dict:
    """Load ``export`` on ``host`` as revision ``key``; the revision once it is ready (or not)."""
    r = host.manage("PUT", f"/manage/revisions/{key}", {"export_dir": str(export), **config})
    assert r.status_code in (200, 202), r.text
    return host.wait_ready(key)


def route(host, name: str, revisions: dict, keys: dict | None = None, max_inputs: int = 64):
    """Route endpoint ``name`` to ``revisions`` (name: weight), open to ``keys`` (KEY unless
    told)."""
    keys = {KEY_HASH: {"id": 1, "rate_per_s": None}} if keys is None else keys
    r = host.manage(
        "PUT",
        f"/manage/endpoints/{name}",
        {"revisions": revisions, "keys": keys, "max_inputs": max_inputs},
    )
    assert r.status_code == 204, r.text


def converge(host, endpoint, timeout: float = 90) -> None:
    """Run the reconciler until every active revision of ``endpoint`` is ready on the host."""
    from deployment.models import Placement, Revision
    from deployment.reconcile import endpoints_reconcile

    deadline = time.monotonic() + timeout
    while True:
        endpoints_reconcile()
        active = endpoint.revisions.filter(status=Revision.Status.ACTIVE)
        states = [p.state for p in Placement.objects.filter(revision__in=active)]
        if len(states) == active.count() and set(states) == {"ready"}:
            endpoints_reconcile()  # routes, and unloads what was replaced
            return
        assert "failed" not in states, list(Placement.objects.values("state", "error"))
        assert time.monotonic() < deadline, states
        time.sleep(0.3)


def openai_client(host, key: str = KEY):
    """The ``openai`` client of ``host``'s OpenAI-compatible API, with ``key``."""
    import openai

    return openai.OpenAI(base_url=f"{host.url}/v1", api_key=key, max_retries=0, timeout=60)


def conversation(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def bare_generate(export: Path, conversations: list[list[dict]], **params) -> list[str]:
    """The in-process engine's completions of a batch (in the runtime venv)."""
    code = (
        "import json,sys\n"
        "from pathlib import Path\n"
        "from runtime.generation import Generator, GenerationRequest\n"
        "g = Generator(Path(sys.argv[1]))\n"
        "args = json.loads(sys.stdin.read())\n"
        "reqs = [GenerationRequest(g.chat_prompt(c), **args['params']) for c in args['convs']]\n"
        "print(json.dumps(g.generate(reqs), ensure_ascii=False))\n"
    )
    return _answers(code, export, {"convs": conversations, "params": params})


def bare_predict(export: Path, items: list) -> list[dict]:
    """The in-process predictor's answers (in the runtime venv, where Paddle is)."""
    code = (
        "import json,sys\n"
        "from runtime.inference import Predictor\n"
        "p = Predictor.load(sys.argv[1])\n"
        "print(json.dumps(p.predict(json.loads(sys.stdin.read())), ensure_ascii=False))\n"
    )
    return _answers(code, export, items)


def _answers(code: str, export: Path, payload) -> list:
    """What ``code`` prints last as JSON, run in the runtime venv on ``export`` (its argv[1])
    with ``payload`` as JSON on its stdin."""
    stdin = json.dumps(payload, ensure_ascii=False)
    out = in_runtime(code, str(export), env=dict(os.environ), stdin=stdin, timeout=120)
    return json.loads(out.strip().splitlines()[-1])


# -- Browser tests -----------------------------------------------------------------------------


def login(page: Page, username: str, password: str) -> None:
    page.goto("/login/")
    page.get_by_label("用户名").fill(username)
    page.get_by_label("密码").fill(password)
    page.get_by_role("button", name="登录").click()


def new_user_page(browser: Browser, base_url: str) -> tuple[BrowserContext, Page]:
    """A browser of another user's own (their cookies), as the `page` fixture sets it up."""
    context = browser.new_context(base_url=base_url, locale="zh-CN")
    context.set_default_timeout(15_000)
    return context, context.new_page()


def admin_creates_team(page: Page, name: str) -> None:
    """A site administrator's first login: the console asks for a team, they make ``name``."""
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect

    get_user_model().objects.create_superuser("admin", password="Admin-Pass-2026")
    login(page, "admin", "Admin-Pass-2026")
    expect(page.get_by_role("heading", name="新建团队")).to_be_visible()
    page.get_by_label("团队名称").fill(name)
    page.get_by_role("button", name="创建团队").click()
    expect(page.get_by_role("heading", name=name)).to_be_visible()


def new_dataset(page: Page, name: str, labels: str = "") -> None:
    """A text-classification dataset made on the datasets page; its page."""
    from playwright.sync_api import expect

    page.get_by_role("navigation").get_by_role("link", name="数据集").click()
    form = page.get_by_test_id("new-dataset")
    form.get_by_label("名称").fill(name)
    form.get_by_label("任务类型").select_option("text_classification")
    if labels:
        form.get_by_label("标签").fill(labels)
    form.get_by_role("button", name="创建数据集").click()
    expect(page.get_by_role("heading", name=name)).to_be_visible()


def upload_gbk_csv(page: Page, path: Path, preview: str = "", shot_as: str = "") -> None:
    """From a dataset's page: upload the GBK CSV at ``path`` and import it; returns once the
    import has succeeded. With ``preview``, the mapping page must show it and map the header
    (评论内容, 情感) to text and label."""
    from playwright.sync_api import expect

    page.get_by_label("文件").set_input_files(str(path))
    page.get_by_role("button", name="上传", exact=True).click()
    expect(page.get_by_test_id("detected-encoding")).to_contain_text("GBK")
    if preview:
        expect(page.get_by_test_id("preview")).to_contain_text(preview)
        expect(page.locator("#id_map_text")).to_have_value("评论内容")
        expect(page.locator("#id_map_label")).to_have_value("情感")
    if shot_as:
        shot(page, shot_as)
    page.get_by_role("button", name="导入").click()
    # The import runs on the worker; the page follows its progress.
    expect(page.get_by_test_id("import-status")).to_have_text("成功", timeout=60_000)


def new_labeling_project(page: Page, name: str, selection: str = "") -> None:
    """From a dataset version's page: a labeling project of it (of the rows ``selection``
    picks), once Label Studio has it."""
    from playwright.sync_api import expect

    page.get_by_test_id("label-link").click()
    form = page.get_by_test_id("new-project")
    form.get_by_label("名称").fill(name)
    if selection:
        form.locator("#id_selection").select_option(selection)
    form.get_by_role("button", name="在 Label Studio 中创建").click()
    expect(page.get_by_test_id("project-status")).to_have_text("就绪", timeout=60_000)


def open_label_studio(page: Page) -> Page:
    """Label Studio's page, opened from a labeling project's page in the console (a new tab,
    logged in by the console's hand-over)."""
    with page.context.expect_page() as opened:
        page.get_by_test_id("open-ls").click()
    ls_page = opened.value
    ls_page.set_default_timeout(30_000)
    return ls_page


def export_labeled(page: Page, annotator: str, shot_as: str = "") -> None:
    """On a labeling project's page, once the webhook has brought ``annotator``'s annotations:
    export a new version; returns once its import has succeeded."""
    from playwright.sync_api import expect

    expect(page.get_by_test_id("per-annotator")).to_contain_text(annotator, timeout=30_000)
    page.reload()  # the export form comes with a ready project
    if shot_as:
        shot(page, shot_as)
    page.get_by_test_id("export").get_by_role("button", name="导出为新版本").click()
    expect(page.get_by_test_id("import-status")).to_have_text("成功", timeout=60_000)


def submit_job(page: Page, version, model: str = "", shot_as: str = "", **fields) -> None:
    """From the training page: a job on ``version`` (of ``model`` where told), the form's
    other ``fields`` (epochs=8: #id_epochs) filled in."""
    page.get_by_test_id("new-job").click()
    form = page.get_by_test_id("job-form")
    form.locator("#id_dataset_version").select_option(str(version.pk))
    if model:
        form.locator("#id_model").select_option(model)
    for field, value in fields.items():
        form.locator(f"#id_{field}").fill(str(value))
    if shot_as:
        shot(page, shot_as)
    page.get_by_test_id("submit-job").click()


def open_report(page: Page, labels: tuple[str, str], lineage: str) -> None:
    """From a finished job's page: its model version's evaluation report, with its metrics,
    confusion matrix and figures per label, and the dataset version it learned from."""
    from playwright.sync_api import expect

    page.get_by_test_id("model-link").get_by_role("link").click()
    expect(page.get_by_test_id("metrics")).to_contain_text("accuracy")
    expect(page.get_by_test_id("confusion")).to_contain_text(labels[0])
    expect(page.get_by_test_id("per-label")).to_contain_text(labels[1])
    expect(page.get_by_test_id("lineage")).to_contain_text(lineage)


def deploy(page: Page, name: str, url_part: str, timeout: float = 90) -> None:
    """From a model version's page: deploy it as endpoint ``name``; returns once it is ready."""
    from playwright.sync_api import expect

    page.get_by_test_id("deploy").click()
    form = page.get_by_test_id("deploy-form")
    form.locator("#id_name").fill(name)
    form.locator("button[type=submit]").click()
    expect(page.get_by_test_id("endpoint-url")).to_contain_text(url_part)
    wait_endpoint_ready(page, timeout)


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
