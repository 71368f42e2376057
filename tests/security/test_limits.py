"""Shares and limits, attacked as an insider would through the real API, console and workers: a
maintainer publishing a site-wide base model or shadowing a team's model with one, uploads past
the team's quota or left to pile up, a slow upload holding the database's write lock, more jobs
than a user's share (from several teams), the top priority, a job that runs for ever, a
dataset of as many labels as its rows name, and a model as large as its labels make it."""

import json
import re
import socket
import struct
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.test import Client
from django.utils import timezone

from console.celery import app as celery_app
from console.roles import Role
from console.services import api_token_create
from labeling.datasets import dataset_create, staging_path
from labeling.models import Dataset, Upload
from labeling.task_kinds import KINDS
from labeling.task_kinds.base import MAX_LABEL_CHARS
from tests.helpers.data import csv_data, import_file, make_jsonl_version, rows_for
from tests.helpers.jobs import wait_for
from tests.helpers.models import in_runtime
from training.models import BaseModel, TrainingJob
from training.supervision import job_workdir

# -- Helpers --------------------------------------------------------------------------------------


def bearer(user) -> str:
    _token, key = api_token_create(actor=user, name="limits")
    return f"Bearer {key}"


def api_client(user) -> Client:
    """The Django test client with the user's API token: real request handling, no shortcut
    past authentication or permissions."""
    return Client(HTTP_AUTHORIZATION=bearer(user), HTTP_ACCEPT_LANGUAGE="en")


def console_client(user) -> Client:
    """The console in English, logged in as ``user``."""
    client = Client()
    client.cookies["django_language"] = "en"
    client.force_login(user)
    return client


def detail(response) -> str:
    body = response.json()
    found = body.get("detail", body)
    return " ".join(found) if isinstance(found, list) else str(found)


def make_version(team, user, name: str = "reviews"):
    dataset = dataset_create(actor=user, team=team, name=name, task_kind="text_classification")
    rows, mapping = rows_for("text_classification", 40)
    return make_jsonl_version(dataset, user, rows, mapping)


def submit(client: Client, team, version, **fields):
    return client.post(
        f"/api/v1/teams/{team.slug}/training-jobs/",
        {"dataset_id": version.dataset_id, "dataset_version": version.number, **fields},
        content_type="application/json",
    )


def safetensors_bytes() -> bytes:
    """A valid one-tensor safetensors file (8-byte header length, JSON header, data)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\x00\x00\x80\x3f"


@pytest.fixture
def bert_dir() -> str:
    """A Hugging Face layout (torch backend) under the server's import directory."""
    directory = Path(settings.MODEL_IMPORT_DIR) / "limits-bert"
    directory.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "bert", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 6}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "model.safetensors").write_bytes(safetensors_bytes())
    (directory / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n好\n差\n", encoding="utf-8")
    return "limits-bert"


# -- Shared base models ---------------------------------------------------------------------------


def test_only_site_staff_publish_a_base_model_to_every_team(make_user, make_team, bert_dir):
    maintainer, staff = make_user("mallory"), make_user("sam", is_staff=True)
    team = make_team("Alpha", {maintainer: Role.MAINTAINER, staff: Role.OWNER})
    url = f"/api/v1/teams/{team.slug}/base-models/"
    payload = {"name": "bert-zh", "backend": "torch", "path": bert_dir, "shared": True}

    refused = api_client(maintainer).post(url, payload, content_type="application/json")
    assert refused.status_code == 403, refused.content
    assert "Only site staff may share a base model" in detail(refused)
    assert not BaseModel.objects.exists()

    published = api_client(staff).post(url, payload, content_type="application/json")
    assert published.status_code == 201, published.content
    assert published.json()["shared"] is True and published.json()["owner"] == "site"

    # Nor may the maintainer take it back, or publish the team's own.
    shared_id = published.json()["id"]
    unshare = api_client(maintainer).patch(
        f"{url}{shared_id}/", {"shared": False}, content_type="application/json"
    )
    assert unshare.status_code == 403 and "Only site staff" in detail(unshare)
    assert BaseModel.objects.get(pk=shared_id).team_id is None
    # The console's import form offers no share box to a maintainer, and refuses one posted.
    console = console_client(maintainer)
    page = console.get(f"/t/{team.slug}/base-models/")
    assert page.status_code == 200 and b'name="shared"' not in page.content
    console.post(
        f"/t/{team.slug}/base-models/",
        {"name": "bert-2", "backend": "torch", "path": bert_dir, "shared": "on"},
    )
    assert not BaseModel.objects.filter(name="bert-2", team__isnull=True).exists()


def test_a_teams_own_model_wins_over_a_shared_one_of_the_same_name(make_user, make_team):
    """The shared model is the older row (on SQLite its NULL team sorted first): the team's own
    still trains, for a new job, a retry and a clone, and the API and page say whose it is."""
    owner = make_user("olivia")
    team = make_team("Alpha", {owner: Role.OWNER})
    fields = {"backend": "paddle", "architecture": "ernie", "summary": {}, "manifest": {}}
    shared = BaseModel.objects.create(
        team=None, name="ernie-zh", storage_prefix="base_models/shared/", **fields
    )
    own = BaseModel.objects.create(
        team=team, name="ernie-zh", storage_prefix="base_models/own/", **fields
    )
    assert shared.pk < own.pk
    version = make_version(team, owner)
    api = api_client(owner)
    base = f"/api/v1/teams/{team.slug}/training-jobs/"

    created = submit(api, team, version, base_model="ernie-zh")
    assert created.status_code == 201, created.content
    job = created.json()
    assert job["base_model_owner"] == "team"
    assert TrainingJob.objects.get(pk=job["id"]).base_model_id == own.pk

    assert api.post(f"{base}{job['id']}/cancel/").status_code == 200
    retried = api.post(f"{base}{job['id']}/retry/")
    assert retried.status_code == 201, retried.content
    assert TrainingJob.objects.get(pk=retried.json()["id"]).base_model_id == own.pk

    cloned = api.post(f"{base}{job['id']}/clone/", {}, content_type="application/json")
    assert cloned.status_code == 201, cloned.content
    assert TrainingJob.objects.get(pk=cloned.json()["id"]).base_model_id == own.pk
    assert not TrainingJob.objects.filter(base_model=shared).exists()

    models = api.get(f"/api/v1/teams/{team.slug}/base-models/").json()["results"]
    assert sorted(m["owner"] for m in models) == ["site", "team"]
    console = console_client(owner)
    page = console.get(f"/t/{team.slug}/training/{job['id']}/")
    assert page.status_code == 200
    assert 'data-testid="base-model-owner">(this team\'s)' in page.content.decode()


# -- Storage quota --------------------------------------------------------------------------------


def test_uploads_past_the_teams_storage_quota_are_refused_with_usage_and_limit(
    make_user, make_team, settings
):
    settings.TEAM_STORAGE_QUOTA_GB = 1 / 1024  # 1 MB
    owner = make_user("olivia")
    team = make_team("Alpha", {owner: Role.OWNER})
    api = api_client(owner)
    url = f"/api/v1/teams/{team.slug}/uploads/"

    too_big = api.post(
        url, {"filename": "big.csv", "size": 2 * 2**20}, content_type="application/json"
    )
    assert too_big.status_code == 400
    assert "storage quota would be exceeded: it uses 0.0 MB of its 1.0 MB" in detail(too_big)
    assert not Upload.objects.exists()

    # Two uploads declared within the quota each, but not together: the first reserves its
    # declared size at once, so the second is refused before any byte of either arrives (side
    # by side, they cannot both find the same room).
    size = 600 * 1024

    def send(upload_id: int) -> None:
        sent = api.put(
            f"{url}{upload_id}/",
            b"x" * size,
            content_type="application/octet-stream",
            HTTP_CONTENT_RANGE=f"bytes 0-{size - 1}/{size}",
        )
        assert sent.status_code == 200, sent.content

    first, second = (
        api.post(url, {"filename": f"{n}.csv", "size": size}, content_type="application/json")
        for n in ("a", "b")
    )
    assert first.status_code == 201, first.content
    assert second.status_code == 400, second.content
    assert "it uses 0.6 MB of its 1.0 MB" in detail(second)
    assert Upload.objects.count() == 1
    send(first.json()["id"])

    # A team's own quota (set by staff) overrides the site's; the datasets page shows usage.
    team.storage_quota_gb = 2 / 1024
    team.save()
    retry = api.post(url, {"filename": "b.csv", "size": size}, content_type="application/json")
    assert retry.status_code == 201, retry.content
    send(retry.json()["id"])
    console = console_client(owner)
    page = console.get(f"/t/{team.slug}/datasets/").content.decode()
    assert re.search(r'"storage-usage">Storage: 1.2\sMB used of the team.s 2.0\sMB\.', page)


# -- Abandoned uploads ----------------------------------------------------------------------------


def test_abandoned_uploads_are_deleted_by_the_beat_task_after_their_expiry(make_user, make_team):
    assert any(
        entry["task"] == "labeling.tasks.expire_uploads"
        for entry in celery_app.conf.beat_schedule.values()
    )
    owner = make_user("olivia")
    team = make_team("Alpha", {owner: Role.OWNER})
    api = api_client(owner)
    url = f"/api/v1/teams/{team.slug}/uploads/"

    def upload(data: bytes, sent: int) -> Upload:
        created = api.post(
            url, {"filename": "f.csv", "size": len(data)}, content_type="application/json"
        )
        part = data[:sent]
        api.put(
            f"{url}{created.json()['id']}/",
            part,
            content_type="application/octet-stream",
            HTTP_CONTENT_RANGE=f"bytes 0-{len(part) - 1}/{len(data)}",
        )
        return Upload.objects.get(pk=created.json()["id"])

    half = upload(b"text,label\n" * 100, 500)  # never finished
    unimported = upload(b"text,label\n" * 10, 110)  # finished, never imported
    imported_version = make_version(team, owner)
    imported = Upload.objects.get(storage_name=imported_version.original_file)
    fresh = upload(b"text,label\n" * 10, 50)
    assert half.status == "receiving" and unimported.status == "complete"
    staged = staging_path(half)
    assert staged.exists() and default_storage.exists(unimported.storage_name)

    # A day and an hour later.
    old = timezone.now() - timezone.timedelta(hours=settings.UPLOAD_EXPIRY_HOURS + 1)
    Upload.objects.exclude(pk=fresh.pk).update(created_at=old)
    assert celery_app.tasks["labeling.tasks.expire_uploads"].apply().get() == 2

    assert not Upload.objects.filter(pk__in=[half.pk, unimported.pk]).exists()
    assert not staged.exists() and not default_storage.exists(unimported.storage_name)
    assert api.get(f"{url}{half.pk}/").status_code == 404
    # What was imported stays (the version's original), and so does a fresh upload.
    assert Upload.objects.filter(pk__in=[imported.pk, fresh.pk]).count() == 2
    assert default_storage.exists(imported_version.original_file)


# -- A slow upload and the database's write lock --------------------------------------------------


@pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"),
    reason="SQLite's write lock is the whole database's",
)
@pytest.mark.django_db(transaction=True)
def test_a_slow_chunk_upload_does_not_block_another_teams_writes(live_server, make_user, make_team):
    slow_user, other = make_user("slowpoke"), make_user("bob")
    slow_team = make_team("Slow", {slow_user: Role.OWNER})
    other_team = make_team("Other", {other: Role.OWNER})
    slow_auth, other_auth = bearer(slow_user), bearer(other)
    size = 64 * 1024
    created = httpx.post(
        f"{live_server.url}/api/v1/teams/{slow_team.slug}/uploads/",
        json={"filename": "slow.csv", "size": size},
        headers={"Authorization": slow_auth},
    )
    assert created.status_code == 201, created.text
    upload_id = created.json()["id"]

    host, port = live_server.thread.host, live_server.thread.port
    sock = socket.create_connection((host, port))
    head = (
        f"PUT /api/v1/teams/{slow_team.slug}/uploads/{upload_id}/ HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\nAuthorization: {slow_auth}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n"
        f"Content-Range: bytes 0-{size - 1}/{size}\r\nConnection: close\r\n\r\n"
    )
    sock.sendall(head.encode() + b"x" * 1024)  # and then nothing for a while
    time.sleep(1)  # the server is reading the body now

    started = time.monotonic()
    try:
        response = httpx.post(
            f"{live_server.url}/api/v1/teams/{other_team.slug}/datasets/",
            json={"name": "meanwhile", "task_kind": "text_classification"},
            headers={"Authorization": other_auth},
            timeout=40,
        )
    finally:
        took = time.monotonic() - started
        sock.sendall(b"x" * (size - 1024))  # the body ends (and the old code's lock with it)
    assert response.status_code == 201, response.text
    assert took < 5, f"another team's write waited {took:.1f} s for the slow upload"

    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    sock.close()
    assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
    assert Upload.objects.get(pk=upload_id).status == "complete"
    assert Dataset.objects.filter(team=other_team, name="meanwhile").exists()


# -- Jobs: per-user limit, top priority, maximum run time -----------------------------------------


def test_a_user_cannot_run_more_jobs_than_their_share_by_using_several_teams(
    make_user, make_team, settings
):
    settings.TRAINING_MAX_CONCURRENT_PER_USER = 2
    settings.TRAINING_TEAM_CONCURRENCY = 2
    user = make_user("mallory")
    teams = [make_team(name, {user: Role.OWNER}) for name in ("One", "Two", "Three")]
    api = api_client(user)
    versions = [make_version(team, user) for team in teams]

    for team, version in zip(teams[:2], versions[:2], strict=True):
        assert submit(api, team, version).status_code == 201
    extra = submit(api, teams[2], versions[2])
    assert extra.status_code == 400
    assert "You have 2 training jobs queued or running (in all your teams); the limit is 2" in (
        detail(extra)
    )
    assert TrainingJob.objects.count() == 2
    # One ends: the next is accepted.
    first = TrainingJob.objects.filter(team=teams[0]).get()
    api.post(f"/api/v1/teams/{teams[0].slug}/training-jobs/{first.pk}/cancel/")
    assert submit(api, teams[2], versions[2]).status_code == 201


def test_the_top_priority_is_for_owners_and_staff_only(make_user, make_team):
    owner, maintainer = make_user("olivia"), make_user("mallory")
    team = make_team("Alpha", {owner: Role.OWNER, maintainer: Role.MAINTAINER})
    version = make_version(team, owner)
    as_maintainer, as_owner = api_client(maintainer), api_client(owner)
    top, high = TrainingJob.Priority.TOP, TrainingJob.Priority.HIGH

    refused = submit(as_maintainer, team, version, priority=top)
    assert refused.status_code == 403
    assert "The top priority is for the team's owners and site staff" in detail(refused)
    assert not TrainingJob.objects.exists()
    assert submit(as_maintainer, team, version, priority=high).status_code == 201
    owners = submit(as_owner, team, version, priority=top)
    assert owners.status_code == 201 and owners.json()["priority"] == top

    # Nor through the owner's job: a clone at top, or a retry of it.
    base = f"/api/v1/teams/{team.slug}/training-jobs/{owners.json()['id']}/"
    clone = as_maintainer.post(f"{base}clone/", {}, content_type="application/json")
    assert clone.status_code == 403
    as_owner.post(f"{base}cancel/")
    assert as_maintainer.post(f"{base}retry/").status_code == 403
    assert TrainingJob.objects.filter(priority=top).count() == 1
    # The console offers top to the owner only.
    console = console_client(maintainer)
    page = console.get(f"/t/{team.slug}/training/new/").content.decode()
    assert '<option value="2"' in page and '<option value="0"' not in page


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("train_worker")
def test_a_job_past_its_maximum_run_time_is_stopped_and_failed(make_user, make_team, settings):
    settings.TRAINING_MAX_HOURS = 0.003  # 10.8 s, as the job records it at submission
    owner = make_user("olivia")
    team = make_team("Alpha", {owner: Role.OWNER})
    version = make_version(team, owner)
    api = api_client(owner)

    longer = submit(api, team, version, max_hours=1)
    assert longer.status_code == 400
    assert "A job runs at most 0.003 hours on this site" in detail(longer)

    created = submit(
        api, team, version, hyperparameters={"epochs": 1000, "early_stopping_patience": 0}
    )
    assert created.status_code == 201, created.content
    job = TrainingJob.objects.get(pk=created.json()["id"])
    assert job.max_hours == 0.003
    job = wait_for(job, timeout=120)
    assert job.status == "failed"
    # Written by the train worker, in the site's language (zh-hans): its figures and setting.
    assert "0.003" in job.error and "TRAINING_MAX_HOURS" in job.error, job.error
    assert (job.finished_at - job.started_at).total_seconds() < 60
    runner = subprocess.run(
        ["pgrep", "-f", f"runtime.run {job_workdir(job)}$"],
        capture_output=True,
    )
    assert runner.returncode == 1, "the runner still runs"


# A tagger trained by the runner on rows whose entities carry argv[2] labels (two tags each):
# its wide table's cells, their bound and the bytes of its weights.
MANY_LABELS = r"""
import json, random, sys
from pathlib import Path

import runtime.run as runner
from runtime.backends.paddle_models import WIDE_TABLE_MAX
from runtime.spec import Hyperparameters, JobSpec

workdir = Path(sys.argv[1])
rng = random.Random(0)
labels = [f"类{i}" for i in range(int(sys.argv[2]))]
(workdir / "data").mkdir(parents=True)
for split, n in (("train", 48), ("dev", 8), ("test", 8)):
    rows = []
    for _ in range(n):
        text = "".join(rng.choice("甲乙丙丁戊己庚辛壬癸") for _ in range(12))
        entity = {"start": 2, "end": 4, "label": rng.choice(labels)}
        rows.append({"text": text, "entities": [entity]})
    (workdir / "data" / f"{split}.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8"
    )
hp = Hyperparameters(epochs=1, batch_size=8, max_seq_length=32, checkpoint_steps=0)
spec = JobSpec(job_id=1, task_kind="ner", labels=labels, backend="paddle", hyperparameters=hp)
spec.preset = "bigru-crf-char"
spec.save(workdir)
runner.emit = lambda *a, **k: None
runner.run(workdir)
for config in workdir.rglob("config.json"):
    c = json.loads(config.read_text("utf-8"))
    if c.get("architecture") == "bigru_crf":
        size = sum(f.stat().st_size for f in config.parent.glob("*.safetensors"))
        cells = c["wide_buckets"] * c["num_labels"]
        print(json.dumps({"cells": cells, "max": WIDE_TABLE_MAX, "bytes": size}))
"""


def test_a_fast_models_wide_table_is_bounded_whatever_the_number_of_labels(tmp_path):
    """The labels are the data's to choose, and a fast model's wide table has a column per
    label or tag: 60 entity types (121 tags) at the tagger's 2^20 buckets would be 500 MB of
    weights a model. The buckets are halved until the table fits ``WIDE_TABLE_MAX``."""
    lines = in_runtime(MANY_LABELS, str(tmp_path / "job"), "60", timeout=300).splitlines()
    models = [json.loads(line) for line in lines if line.startswith("{")]
    assert models
    for model in models:
        assert 0 < model["cells"] <= model["max"], model
        assert model["bytes"] < 4 * model["max"] + 200 * 2**20, model  # the table and the rest


def _report(version) -> dict[int, dict]:
    with default_storage.open(version.report_file) as f:
        return {e["row"]: e for e in map(json.loads, f.read().decode().splitlines())}


@pytest.mark.django_db
def test_a_dataset_holds_no_more_labels_than_its_kind_takes_whatever_its_rows_name(
    make_user, make_team
):
    """Every head, report and labeling config grows with the labels, and an uploader's rows
    choose them: past the kind's limit a row with a new label is refused by row, the others
    import."""
    owner = make_user("olga")
    team = make_team("Labels", {owner: Role.OWNER})
    limit = KINDS["text_classification"].max_labels
    dataset = dataset_create(actor=owner, team=team, name="many", task_kind="text_classification")
    rows = [["text", "label"]] + [[f"第{i}条评论", f"类{i}"] for i in range(limit + 2)]
    rows.append(["又一条", "类0"])  # a label already seen still imports
    version = import_file(dataset, owner, csv_data(rows)).version
    assert version.row_count == limit + 1
    assert version.errors_by_reason == {"too_many_labels": 2}
    assert len(version.stats["labels"]) == limit
    refused = _report(version)[limit + 2]  # the header is row 1
    assert refused["reason"] == "too_many_labels" and refused["column"] == "label"
    assert f"类{limit}" in refused["message"] and str(limit) in refused["message"]

    # NER: each type is two tags and a CRF's transitions their square.
    ner_limit = KINDS["ner"].max_labels
    ner = dataset_create(actor=owner, team=team, name="types", task_kind="ner")
    records = [
        {"text": f"张三{i}", "entities": [{"start": 0, "end": 2, "label": f"型{i}"}]}
        for i in range(ner_limit + 1)
    ]
    version = make_jsonl_version(ner, owner, records, {"text": "text", "entities": "entities"})
    assert version.row_count == ner_limit and version.errors_by_reason == {"too_many_labels": 1}

    # A label is a name, not a text: a long one is refused with its row; and a label list a
    # user gives is held to the same limits.
    long = "长" * (MAX_LABEL_CHARS + 1)
    job = import_file(dataset, owner, csv_data([["text", "label"], ["a", "好"], ["b", long]]))
    assert job.version.errors_by_reason == {"bad_labels": 1}
    with pytest.raises(ValidationError, match=f"at most {limit}"):
        dataset_create(
            actor=owner,
            team=team,
            name="typed",
            task_kind="text_classification",
            labels=[f"类{i}" for i in range(limit + 1)],
        )
    with pytest.raises(ValidationError, match=str(MAX_LABEL_CHARS)):
        dataset_create(actor=owner, team=team, name="long", task_kind="ner", labels=["人名", long])
    assert not Dataset.objects.filter(name__in=["typed", "long"]).exists()
