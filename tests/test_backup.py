"""Backup and restore (console/backup.py) on the suite's real database (PostgreSQL in CI, where
pg_dump and pg_restore do the work; SQLite elsewhere) and storage: a platform with a dataset, a
model version, an endpoint, a notification channel, a labeling project annotated in the
suite's Label Studio and its audit log is backed up while a job runs on the real train worker,
and restored into a new database and data directory by ``manage.py platform_restore`` and
``migrate`` in processes of their own, as the operator's guide says; the restored installation
has the same objects, files that match their sha256, its keys (a sealed channel opens), an
endpoint that its reconciler loads onto the serving host from the restored storage and that
answers the original's key as before, and a Label Studio started on the restored directory that
holds the annotations, which a sync of the restored platform finds already taken in."""

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest
from django.core.management import call_command
from django.db import connection

from console.backup import BackupError, backup_restore, backup_verify
from console.models import AuditEvent
from console.notifications import channel_create
from labeling.projects import labeling_project_create
from labeling.sync import labeling_project_sync
from tests.helpers.data import make_version, reviews_dataset, version_for
from tests.helpers.jobs import wait_for
from tests.helpers.label_studio import (
    UNLABELED_REVIEWS,
    annotate,
    choice,
    launcher,
    needs_label_studio,
    task_ids,
)
from tests.helpers.serving import converge
from tests.helpers.system import ROOT
from tests.helpers.workers import new_database
from training.jobs import training_job_cancel, training_job_submit

pytestmark = pytest.mark.django_db(transaction=True)

CHECK = """
import hashlib, json
from django.core.files.storage import default_storage
from console.models import AuditEvent, NotificationChannel, Team
from console.notifications import unseal
from deployment.models import Endpoint
from labeling.models import DatasetVersion
from training.models import ModelVersion, TrainingJob
version = ModelVersion.objects.get()
intact = all(
    hashlib.sha256(default_storage.open(version.storage_prefix + rel).read()).hexdigest()
    == meta["sha256"]
    for rel, meta in version.files.items()
)
data = DatasetVersion.objects.get(dataset__name="评论")
print(json.dumps({
    "teams": sorted(Team.objects.values_list("slug", flat=True)),
    "endpoint": Endpoint.objects.get().name,
    "model_files_intact": intact,
    "dataset_rows": len(default_storage.open(data.data_file).read().splitlines()),
    "audit": AuditEvent.objects.count(),
    "job": TrainingJob.objects.get(name__startswith="评论").status,
    "robot": unseal(NotificationChannel.objects.get().target),
}))
"""
# The restored installation's reconciler, until the serving host has loaded and routed what
# its database says (as beat does every few seconds once the platform runs).
RECONCILE = """
import time
from deployment.models import Placement
from deployment.reconcile import endpoints_reconcile
deadline = time.monotonic() + 90
while True:
    endpoints_reconcile()
    states = set(Placement.objects.values_list("state", flat=True))
    if states == {"ready"}:
        endpoints_reconcile()
        break
    assert "failed" not in states and time.monotonic() < deadline, states
    time.sleep(0.3)
"""
# In the restored installation beside a Label Studio started on its restored directory: the
# annotations as Label Studio shows them, and what a sync takes in (nothing new, nothing lost).
LABELS_CHECK = """
import json
from labeling.label_studio import client
from labeling.models import LabelingProject
from labeling.sync import labeling_project_sync
project = LabelingProject.objects.get(name="备份标注")
tasks = client(project.team).tasks.list(project=project.ls_project_id, fields="all")
print(json.dumps({
    "in_label_studio": sorted(
        r["value"]["choices"][0]
        for t in tasks for a in t.annotations or [] for r in a["result"]
    ),
    "sync": labeling_project_sync(project.pk),
    "taken_in": sorted(project.annotations.values_list("value__label", flat=True)),
}, ensure_ascii=False))
"""


def manage(data_dir, database_url, *args, secret_key="", check=True, extra=None):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PLATFORM_DATA_DIR": str(data_dir),
        "DATABASE_URL": database_url,
        # As `make run` does: the key from the data directory (restored there).
        "SECRET_KEY": secret_key or "a-placeholder-key-before-the-restore-0123456789",
    }
    env.pop("LABEL_STUDIO_DATA_DIR", None)
    env.pop("LABEL_STUDIO_URL", None)
    env.update(extra or {})
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@needs_label_studio
@pytest.mark.usefixtures("train_worker", "celery_worker_process")
def test_a_backup_taken_while_a_job_runs_restores_into_an_empty_installation(
    tmp_path, team, owner, model_version, fresh_host, settings
):
    from deployment.keys import endpoint_key_create
    from deployment.rollout import endpoint_deploy
    from labeling.datasets import dataset_create

    settings.NOTIFY_ROBOT_HOSTS = ["oapi.dingtalk.com"]
    robot = "https://oapi.dingtalk.com/robot/send?access_token=restored-token"
    channel_create(
        actor=owner, team=team, name="群", kind="dingtalk", target=robot, secret="s",
        events=["job_failed"],
    )  # fmt: skip
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=model_version())
    _key, plain = endpoint_key_create(actor=owner, endpoint=endpoint, name="app")
    converge(fresh_host, endpoint)
    texts = {"inputs": ["房间干净", "早餐很差"]}
    served = fresh_host.predict("reviews", texts, plain).json()["outputs"]
    dataset = dataset_create(actor=owner, team=team, name="评论", task_kind="text_classification")
    version = version_for(dataset, owner, 80)
    labeling = make_version(reviews_dataset(team, owner, "待标注"), owner, UNLABELED_REVIEWS)
    project = labeling_project_create(actor=owner, version=labeling, name="备份标注")
    wait_for(project, until=lambda p: p.tasks.count() == 3)  # pushed by the Celery worker
    for row, task_id in task_ids(project).items():
        annotate(team, owner, task_id, choice("正面" if row % 2 else "负面"))
    labeling_project_sync(project.pk)  # (or the webhook's sync on the worker did already)
    assert project.annotations.count() == 3
    labels = sorted(project.annotations.values_list("value__label", flat=True))
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        hyperparameters={"epochs": 500, "early_stopping_patience": 0},
    )
    wait_for(job, until=lambda j: j.step > 0)  # training while the backup is taken

    call_command("platform_backup", "--output", str(tmp_path / "backups"))
    (archive,) = (tmp_path / "backups").glob("platform-backup-*.tar")
    assert archive.stat().st_mode & 0o077 == 0  # it holds the keys: the owner's alone
    manifest = backup_verify(archive)
    engine = "sqlite" if connection.vendor == "sqlite" else "postgresql"
    assert manifest["database"] == engine and f"database/{engine}.dump" in manifest["files"]
    assert "console.0007_notifications" in manifest["migrations"]
    training_job_cancel(actor=owner, job=job)
    audit_count = AuditEvent.objects.count()

    database_url, drop = new_database(tmp_path, "restored")
    try:
        restored = tmp_path / "restored-data"
        restored.mkdir()
        manage(restored, database_url, "platform_restore", str(archive))
        key = (restored / "secret_key").read_text()
        assert key == settings.SECRET_KEY
        manage(restored, database_url, "migrate", "--noinput", secret_key=key)
        answer = manage(restored, database_url, "shell", "-c", CHECK, secret_key=key)
        figures = json.loads(answer.stdout.strip().splitlines()[-1])
        assert figures["teams"] == [team.slug]
        assert figures["endpoint"] == "reviews" and figures["model_files_intact"]
        assert figures["dataset_rows"] == 80
        assert figures["job"] == "running"  # as the snapshot saw it; beat's reconcile requeues
        assert figures["robot"] == robot  # the keys came back: sealed secrets open
        assert figures["audit"] <= audit_count and figures["audit"] > 0
        # Its reconciler loads the endpoint from the restored storage; the original's key
        # calls it, and it answers as before.
        manage(restored, database_url, "shell", "-c", RECONCILE, secret_key=key)
        (loaded,) = fresh_host.state()["revisions"].values()
        assert loaded["config"]["export_dir"].startswith(str(restored))
        answer = fresh_host.predict("reviews", texts, plain)
        assert answer.status_code == 200 and answer.json()["outputs"] == served

        # Label Studio on its restored directory (its admin's password restored with it),
        # with the platform's token as the original installation had it.
        ls = launcher()
        port = ls.free_port()
        ls_dir = restored / "label-studio"
        with open(tmp_path / "ls.log", "ab") as log:
            server = ls.start(port, ls_dir, ls.admin_password(ls_dir), log, webhook_ports="*")
            try:
                ls.wait_until_up(f"http://127.0.0.1:{port}", server)
                answer = manage(
                    restored, database_url, "shell", "-c", LABELS_CHECK, secret_key=key,
                    extra={"LABEL_STUDIO_URL": f"http://127.0.0.1:{port}",
                           "LABEL_STUDIO_TOKEN": settings.LABEL_STUDIO_TOKEN},
                )  # fmt: skip
            finally:
                server.terminate()
                server.wait(timeout=30)
        found = json.loads(answer.stdout.strip().splitlines()[-1])
        assert found["in_label_studio"] == found["taken_in"] == labels
        assert found["sync"] == {"created": 0, "updated": 0, "deleted": 0, "invalid": 0}

        # Into a platform that is not empty: refused, and nothing is written.
        again = manage(restored, database_url, "platform_restore", str(archive), check=False)
        assert again.returncode != 0 and "not empty" in again.stderr
    finally:
        drop()


def test_a_damaged_or_foreign_archive_is_refused_before_anything_is_written(tmp_path):
    damaged = tmp_path / "damaged.tar"
    manifest = {"format": 1, "database": "sqlite", "migrations": [], "files": {
        "storage/a.txt": {"size": 5, "sha256": "0" * 64}}}  # fmt: skip
    with tarfile.open(damaged, "w") as tar:
        for name, data in (
            ("manifest.json", json.dumps(manifest).encode()),
            ("storage/a.txt", b"hello"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(BackupError, match="does not match its sha256"):
        backup_restore(damaged)
    escaping = tmp_path / "escaping.tar"
    with tarfile.open(escaping, "w") as tar:
        info = tarfile.TarInfo("manifest.json")
        data = json.dumps({**manifest, "files": {}}).encode()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("storage/../../etc/x")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(BackupError, match="unsafe member name"):
        backup_restore(escaping)
    not_ours = tmp_path / "other.tar"
    with tarfile.open(not_ours, "w"):
        pass
    with pytest.raises(BackupError, match="not a platform backup"):
        backup_restore(not_ours)
