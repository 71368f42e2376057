"""Several machines that share only PostgreSQL/SQLite, Redis and S3-compatible object storage
(DESIGN.md, "Scale"): the console (this test process) and a train worker on another "machine"
(its own PLATFORM_DATA_DIR, and its own local TRAINING_WORK_DIR under it) exchange the dataset
version and the trained model through the bucket alone.

The S3 server is moto's standalone server (`moto[server]` in the `test` extra), a real HTTP
server in a process of its own: no MinIO server is packaged on PyPI, npm or Debian. Without it
the test is skipped and says why; in CI (CI=true) it fails instead."""

import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.db import transaction

from runtime.net import free_port
from tests.helpers.data import make_jsonl_version, rows_for
from tests.helpers.jobs import wait_for
from tests.helpers.system import ROOT
from tests.helpers.workers import start_train_worker, stop_worker
from training.jobs import training_job_submit
from training.models import ModelVersion

pytestmark = pytest.mark.django_db(transaction=True)

# A device type no other train worker of the suite serves (they take train.cpu, npu, xpu).
DEVICE = "mlu"
FAST = {"epochs": 1, "batch_size": 16, "max_seq_length": 32}


def _unavailable(reason: str) -> None:
    """Skip with the reason; in CI a missing S3 server is a failure, not a skip."""
    if os.environ.get("CI"):
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


def _client(env: dict[str, str]):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=env["AWS_S3_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[dict[str, str]]:
    """moto's S3 server on a free loopback port with one empty bucket; the AWS_* variables
    that console/settings.py reads to use it (STORAGE_BACKEND=s3)."""
    try:
        import moto.server  # noqa: F401 - only to know the server can start
    except ImportError as exc:
        _unavailable(f"S3 tests skipped: {exc} (install the test extra: pip install -e .[test])")
    port = free_port()
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    env = {
        "STORAGE_BACKEND": "s3",
        "AWS_STORAGE_BUCKET_NAME": f"platform-{uuid.uuid4().hex[:12]}",
        "AWS_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test-access-key",
        "AWS_SECRET_ACCESS_KEY": "test-secret-key",
    }
    client = _client(env)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_bucket(Bucket=env["AWS_STORAGE_BUCKET_NAME"])
            break
        except Exception as exc:  # connection refused until the server listens
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                tail = log.read_text(errors="replace")[-2000:]
                _unavailable(f"S3 tests skipped: moto's S3 server did not start: {exc}\n{tail}")
            time.sleep(0.2)
    yield env
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def bucket(s3_server) -> Callable[[str], dict[str, int]]:
    """The bucket's objects under a prefix: {key: size}."""
    client = _client(s3_server)

    def objects(prefix: str = "") -> dict[str, int]:
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=s3_server["AWS_STORAGE_BUCKET_NAME"], Prefix=prefix
        )
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

    return objects


@pytest.fixture
def console_on_s3(s3_server, settings, monkeypatch):
    """This process, the console machine, on the bucket: STORAGES["default"] as
    console/settings.py builds it from the same variables as the worker's. The settings fixture
    fires setting_changed, on which Django drops the default_storage it had made."""
    from django.core.files.storage import default_storage
    from storages.backends.s3 import S3Storage

    with monkeypatch.context() as m:
        for name, value in s3_server.items():
            m.setenv(name, value)
        storages = runpy.run_path(str(ROOT / "console" / "settings.py"))["STORAGES"]
    settings.STORAGES = {**settings.STORAGES, "default": storages["default"]}
    assert isinstance(default_storage, S3Storage), type(default_storage)
    return s3_server


@pytest.fixture
def remote_node(console_on_s3, django_db_setup) -> Iterator[SimpleNamespace]:
    """A train worker on another "machine": nothing of this process's data dir; its own local
    work dir (TRAINING_WORK_DIR is local disk per node; only storage is shared)."""
    data_dir = Path(tempfile.mkdtemp(prefix="platform-node-"))
    env = {
        **console_on_s3,
        "PLATFORM_DATA_DIR": str(data_dir),
        "TRAINING_WORK_DIR": str(data_dir / "training"),
    }
    proc = start_train_worker(f"s3-node-{os.getpid()}", f"{DEVICE}:1", env)
    yield SimpleNamespace(proc=proc, data_dir=data_dir)
    if proc.poll() is None:
        stop_worker(proc)
    shutil.rmtree(data_dir, ignore_errors=True)


def _files_under(root: Path) -> set[Path]:
    """Files under ``root``, less the SQLite test database (this process's and the workers')."""
    return {p for p in root.rglob("*") if p.is_file() and ".sqlite3" not in p.name}


def test_a_train_worker_on_another_machine_works_through_s3_only(
    team, owner, settings, bucket, remote_node, monkeypatch, tmp_path
):
    from django.core.files.storage import default_storage

    from deployment.reconcile import export_dir
    from labeling.datasets import dataset_create

    local_before = _files_under(Path(settings.DATA_DIR))

    # The dataset version is imported by this process (the console machine) into the bucket. The
    # suite's `default` worker stores on this machine's disk, so the import is kept from it.
    monkeypatch.setattr("labeling.tasks.run_import_job", SimpleNamespace(delay=lambda *a: None))
    dataset = dataset_create(
        actor=owner, team=team, name="s3-reviews", task_kind="text_classification"
    )
    rows, mapping = rows_for("text_classification", 60)
    with transaction.atomic():  # import_file then runs the import here, not on a worker
        version = make_jsonl_version(dataset, owner, rows, mapping)
    assert version.data_file in bucket("teams/")

    with transaction.atomic():
        job = training_job_submit(
            actor=owner,
            team=team,
            dataset_version=version,
            hyperparameters=FAST,
            device_type=DEVICE,
        )
    job = wait_for(job, timeout=100)
    assert job.status == "succeeded", job.error
    assert job.node == f"s3-node-{os.getpid()}"

    # The worker put the model into the bucket, every file of it and nothing else.
    model = ModelVersion.objects.get(job=job)
    stored = bucket(model.storage_prefix)
    assert stored == {model.storage_prefix + rel: m["size"] for rel, m in model.files.items()}
    assert model.storage_prefix + "export/manifest.json" in stored
    assert any(rel.startswith("checkpoint/") for rel in model.files)

    # Nothing of it reached a local disk: neither this machine's nor the worker's media
    # directory, and the worker removed its local work dir.
    assert _files_under(Path(settings.DATA_DIR)) - local_before == set()
    assert not (Path(settings.MEDIA_ROOT) / model.storage_prefix).exists()
    worker_dir = remote_node.data_dir
    assert _files_under(worker_dir / "media") == set()
    assert not (worker_dir / "training" / "jobs" / str(job.pk)).exists()

    # A serving host on this machine gets the export from the bucket: no filesystem path, a
    # local copy checked against each file's sha256.
    with pytest.raises(NotImplementedError):
        default_storage.path(model.storage_prefix + "export/manifest.json")
    settings.SERVING_CACHE_DIR = tmp_path / "serving"
    export = export_dir(model)
    assert export == tmp_path / "serving" / str(model.uid) / "export"
    assert (export / "manifest.json").is_file()
