"""An installation made by an earlier commit of this repository is upgraded to this one with the
operator's guide's steps (stop, back up, migrate, start), each in a process of its own: the
earlier code (``git archive`` of ``EARLIER``) migrates a new database and fills it through its
own services (a team and its members, a dataset version imported from a file, a training job,
a model version with stored files, an endpoint with a key, the audit log); this code backs it up,
migrates it, and finds every object there and working (its pages render, its files match their
sha256, the key still authenticates). The new migrations are then reversed to the earlier
version's and applied again: each is reversible."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.system import ROOT, spare_redis_url
from tests.helpers.workers import new_database

# The commit of the release before this one (the last landing): what sites run now.
EARLIER = "ce1e903"

FILL = r"""
import json, tempfile
from pathlib import Path
from django.contrib.auth import get_user_model
from django.db import transaction
from console.models import Membership
from console.services import team_create
from deployment.keys import endpoint_key_create
from deployment.models import Endpoint
from labeling.datasets import dataset_create
from tests.helpers.data import make_version
from training import storage
from training.jobs import training_job_submit
from training.models import ModelVersion

owner = get_user_model().objects.create_user("olivia", password="pw-0123456789")
owner.is_staff = True  # team creation is site staff's by default
owner.save()
team = team_create(actor=owner, name="Alpha")
viewer = get_user_model().objects.create_user("wang")
Membership.objects.create(team=team, user=viewer, role="viewer")
dataset = dataset_create(actor=owner, team=team, name="评论", task_kind="text_classification")
with transaction.atomic():  # the import runs here, as its task would
    version = make_version(dataset, owner)
job = training_job_submit(actor=owner, team=team, dataset_version=version)
files_dir = Path(tempfile.mkdtemp())
(files_dir / "export").mkdir()
(files_dir / "export" / "weights.bin").write_bytes(bytes(range(256)) * 64)
files = storage.store_dir(files_dir, "models/upgrade/")
model = ModelVersion.objects.create(
    team=team, name="评论", number=1, job=job, dataset_version=version,
    task_kind="text_classification", labels=["正面", "负面"], backend="paddle",
    runtime="paddle_inference", storage_prefix="models/upgrade/", files=files, created_by=owner,
)
endpoint = Endpoint.objects.create(team=team, name="reviews", task_kind="text_classification")
_key, plain = endpoint_key_create(actor=owner, endpoint=endpoint, name="app")
print(json.dumps({"key": plain, "job": job.pk, "model": model.pk, "version": version.pk}))
"""

CHECK = r"""
import hashlib, json
from django.contrib.auth import get_user_model
from django.core.files.storage import default_storage
from django.test import Client
from console.models import AuditEvent, Membership, Team, hash_token
from deployment.models import EndpointKey
from labeling.models import DatasetVersion
from training.models import ModelVersion, TrainingJob
filled = json.loads(FILLED)
team = Team.objects.get(name="Alpha")
model = ModelVersion.objects.get(pk=filled["model"])
version = DatasetVersion.objects.get(pk=filled["version"])
job = TrainingJob.objects.get(pk=filled["job"])
client = Client(HTTP_ACCEPT_LANGUAGE="zh-hans", HTTP_HOST="localhost")
client.force_login(get_user_model().objects.get(username="olivia"))
pages = {
    url: client.get(url).status_code
    for url in (
        f"/t/{team.slug}/", f"/t/{team.slug}/datasets/{version.dataset_id}/",
        f"/t/{team.slug}/training/{job.pk}/", f"/t/{team.slug}/models/{model.pk}/",
        f"/t/{team.slug}/notifications/", f"/t/{team.slug}/usage/",
    )
}
print(json.dumps({
    "members": sorted(
        Membership.objects.filter(team=team).values_list("user__username", flat=True)
    ),
    "rows": len(default_storage.open(version.data_file).read().splitlines()),
    "model_files": all(
        hashlib.sha256(default_storage.open(model.storage_prefix + rel).read()).hexdigest()
        == meta["sha256"] for rel, meta in model.files.items()
    ),
    "job": [job.status, job.paused_s, job.resume_files],
    "key": EndpointKey.objects.filter(
        endpoint__name="reviews", key_hash=hash_token(filled["key"]), revoked_at=None
    ).exists(),
    "audit": AuditEvent.objects.filter(team=team).count(),
    "pages": pages,
}))
"""


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True)


@pytest.mark.django_db(transaction=True)
def test_an_earlier_installation_upgrades_with_the_documented_steps(tmp_path):
    if _git("cat-file", "-e", f"{EARLIER}^{{commit}}").returncode != 0:
        message = f"the clone lacks the earlier commit {EARLIER} (a shallow clone?)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    archive = _git("archive", EARLIER)
    assert archive.returncode == 0, archive.stderr
    subprocess.run(["tar", "-x", "-C", str(earlier)], input=archive.stdout, check=True)
    database_url, drop = new_database(tmp_path, "upgraded")
    data = tmp_path / "data"
    data.mkdir()
    redis = spare_redis_url(1)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PLATFORM_DATA_DIR": str(data),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis,
        "SECRET_KEY": "the-installations-own-secret-key-0123456789",
    }
    env.pop("LABEL_STUDIO_DATA_DIR", None)

    def manage(code: Path, *args: str, **extra: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=code,
            env={**env, **extra},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, (
            f"{code.name} {args}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
        return done.stdout

    try:
        # The site as it runs the earlier release.
        manage(earlier, "migrate", "--noinput")
        filled = manage(earlier, "shell", "-c", FILL).strip().splitlines()[-1]
        # The documented steps with this release: (stopped) back up, migrate, start.
        backups = tmp_path / "backups"
        manage(ROOT, "platform_backup", "--output", str(backups))
        assert len(list(backups.glob("platform-backup-*.tar"))) == 1
        manage(ROOT, "migrate", "--noinput")
        check = CHECK.replace("FILLED", repr(filled))
        figures = json.loads(manage(ROOT, "shell", "-c", check).strip().splitlines()[-1])
        assert figures["members"] == ["olivia", "wang"]
        assert figures["rows"] == 3 and figures["model_files"]
        assert figures["job"] == ["queued", 0.0, {}]  # new fields have their defaults
        assert figures["key"] is True
        assert figures["audit"] >= 3
        assert set(figures["pages"].values()) == {200}, figures["pages"]

        # Every migration added since is reversible: back to the earlier release's, and again.
        leaves = {}
        for app in ("console", "labeling", "training", "deployment"):
            names = sorted(p.stem for p in (earlier / app / "migrations").glob("0*.py"))
            leaves[app] = names[-1]
        for app, leaf in leaves.items():
            manage(ROOT, "migrate", app, leaf, "--noinput")
        manage(ROOT, "migrate", "--noinput")
        figures = json.loads(manage(ROOT, "shell", "-c", check).strip().splitlines()[-1])
        assert figures["members"] == ["olivia", "wang"] and figures["key"] is True
    finally:
        drop()
