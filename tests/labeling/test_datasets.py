"""Datasets through the services, the API and the console: uploads in chunks, imports,
versions, rows, reports, downloads, compare, merge, delete."""

import io
import json

import pytest
from django.core.files.storage import default_storage
from django.test import TestCase
from rest_framework.test import APIClient

from console.models import AuditEvent, Membership
from console.roles import Role
from labeling.datasets import upload_write_chunk
from labeling.imports import import_run
from labeling.models import DatasetVersion, ImportJob, Upload
from tests.helpers.data import import_file, make_version, reviews_dataset

GBK_CSV = "评论,标签\n房间很干净,正面\n早餐太差,负面\n服务热情,正面\n服务热情,正面\n,负面\n".encode(
    "gbk"
)


@pytest.fixture
def dataset(owner, team):
    return reviews_dataset(team, owner, "酒店评论")


@pytest.fixture
def api(owner):
    client = APIClient()
    client.force_authenticate(owner)
    return client


def put_chunk(api, team, upload_id, data: bytes, start: int, total: int):
    return api.put(
        f"/api/v1/teams/{team.slug}/uploads/{upload_id}/",
        data=data,
        content_type="application/octet-stream",
        HTTP_CONTENT_RANGE=f"bytes {start}-{start + len(data) - 1}/{total}",
    )


def upload_via_api(api, team, data: bytes, name="reviews.csv", chunk=7) -> str:
    created = api.post(
        f"/api/v1/teams/{team.slug}/uploads/", {"filename": name, "size": len(data)}, format="json"
    )
    assert created.status_code == 201, created.json()
    upload_id = created.json()["id"]
    for start in range(0, len(data), chunk):
        response = put_chunk(api, team, upload_id, data[start : start + chunk], start, len(data))
        assert response.status_code == 200, response.json()
    assert response.json()["status"] == "complete"
    return upload_id


def test_chunked_upload_resumes_after_an_interrupted_chunk(api, team):
    data = GBK_CSV
    upload_id = api.post(
        f"/api/v1/teams/{team.slug}/uploads/",
        {"filename": "../../etc/passwd.csv", "size": len(data)},
        format="json",
    ).json()["id"]
    # The first chunk arrives, the second is cut short by a dropped connection.
    assert put_chunk(api, team, upload_id, data[:10], 0, len(data)).status_code == 200
    upload = Upload.objects.get(pk=upload_id)
    upload_write_chunk(upload=upload, offset=10, stream=io.BytesIO(data[10:15]), length=20)
    state = api.get(f"/api/v1/teams/{team.slug}/uploads/{upload_id}/").json()
    assert state["received"] == 15 and state["status"] == "receiving"
    # A chunk that would leave a gap, or repeat what arrived, is refused with where to resume.
    gap = put_chunk(api, team, upload_id, data[20:30], 20, len(data))
    assert gap.status_code == 409 and gap.json()["received"] == 15
    again = put_chunk(api, team, upload_id, data[:10], 0, len(data))
    assert again.status_code == 409 and again.json()["received"] == 15
    # Resuming from the server's offset completes the file, byte for byte.
    done = put_chunk(api, team, upload_id, data[15:], 15, len(data))
    assert done.json()["status"] == "complete"
    upload.refresh_from_db()
    assert upload.filename == "passwd.csv"
    assert upload.storage_name.startswith(f"teams/{team.pk}/uploads/")
    with default_storage.open(upload.storage_name, "rb") as f:
        assert f.read() == data


def test_upload_size_limit(api, team, settings):
    settings.UPLOAD_MAX_BYTES = 100
    response = api.post(
        f"/api/v1/teams/{team.slug}/uploads/",
        {"filename": "big.csv", "size": 101},
        format="json",
        HTTP_ACCEPT_LANGUAGE="en",
    )
    assert response.status_code == 400 and "limit" in str(response.json())


def test_preview_detects_gbk_and_proposes_the_mapping(api, team, dataset):
    upload_id = upload_via_api(api, team, GBK_CSV)
    preview = api.get(
        f"/api/v1/teams/{team.slug}/uploads/{upload_id}/preview/", {"dataset": dataset.pk}
    ).json()
    assert (preview["format"], preview["encoding"]) == ("csv", "gbk")
    assert preview["mapping"] == {"text": "评论", "label": "标签"}
    assert preview["rows"][0] == {"评论": "房间很干净", "标签": "正面"}
    wrong = api.get(
        f"/api/v1/teams/{team.slug}/uploads/{upload_id}/preview/",
        {"dataset": dataset.pk, "encoding": "utf-8"},
    ).json()
    assert wrong["error"] or not wrong["rows"]


def test_import_makes_a_version_with_report_stats_and_lineage(api, team, dataset, owner):
    upload_id = upload_via_api(api, team, GBK_CSV)
    job = api.post(
        f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/imports/",
        {"upload": upload_id},
        format="json",
    )
    assert job.status_code == 202 and job.json()["status"] == "queued"
    import_run(job.json()["id"])  # what the Celery task does
    state = api.get(f"/api/v1/teams/{team.slug}/imports/{job.json()['id']}/").json()
    assert state["status"] == "succeeded" and state["version"] == 1
    version = api.get(f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/versions/1/").json()
    assert (version["row_count"], version["rejected_count"], version["duplicate_count"]) == (
        3,
        1,
        1,
    )
    assert version["encoding"] == "gbk" and version["source"] == "upload"
    assert version["stats"]["labels"] == {"正面": 2, "负面": 1}
    assert version["created_by"] == owner.username
    report = api.get(f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/versions/1/report/").json()
    assert {(e["row"], e["reason"]) for e in report["entries"]} == {
        (5, "duplicate"),
        (6, "empty_text"),
    }
    original = api.get(
        f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/versions/1/download/original/"
    )
    assert b"".join(original.streaming_content) == GBK_CSV
    normalized = api.get(
        f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/versions/1/download/normalized/"
    )
    rows = [json.loads(x) for x in b"".join(normalized.streaming_content).splitlines()]
    assert rows[0]["text"] == "房间很干净" and {r["split"] for r in rows} <= {
        "train",
        "dev",
        "test",
    }
    assert AuditEvent.objects.filter(action="dataset_version.create", team=team).exists()


def test_identical_content_makes_no_new_version(owner, dataset):
    first = make_version(dataset, owner)
    job = import_file(dataset, owner, "text,label\n很好,正面\n很差,负面\n一般,正面\n".encode())
    assert job.status == "succeeded" and job.version is None and job.identical_to == first
    assert dataset.versions.count() == 1


def test_failed_import_keeps_its_report_and_says_why(owner, dataset):
    job = import_file(dataset, owner, "text,label\n好,中性\n".encode())
    assert job.status == ImportJob.Status.FAILED and "No valid row" in job.error
    with default_storage.open(job.report_file, "rb") as f:
        entry = json.loads(f.readline())
    assert (entry["row"], entry["column"], entry["reason"]) == (2, "label", "unknown_label")
    assert not DatasetVersion.objects.exists()


def test_rows_are_paginated_searchable_and_filtered(api, owner, team, dataset):
    rows = [["text", "label"]] + [[f"评论{i:03d}", "正面" if i % 3 else "负面"] for i in range(120)]
    version = make_version(dataset, owner, rows)
    base = f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/versions/{version.number}/rows/"
    page2 = api.get(base, {"page": 2}).json()
    assert [r["row"] for r in page2["rows"]] == list(range(51, 101)) and page2["has_next"]
    assert page2["rows"][0]["text"] == "评论050"
    assert [r["text"] for r in api.get(base, {"q": "评论11"}).json()["rows"]] == [
        f"评论11{i}" for i in range(10)
    ]
    negative = api.get(base, {"label": "负面"}).json()["rows"]
    assert len(negative) == 40 and all(r["label"] == "负面" for r in negative)
    dev = api.get(base, {"split": "dev"}).json()["rows"]
    assert len(dev) == 12 and all(r["split"] == "dev" for r in dev)


def test_compare_and_merge(api, owner, team, dataset):
    v1 = make_version(
        dataset, owner, [["text", "label"], ["甲", "正面"], ["乙", "负面"], ["丙", "正面"]]
    )
    v2 = make_version(
        dataset, owner, [["text", "label"], ["甲", "负面"], ["乙", "负面"], ["丁", "正面"]]
    )
    diff = api.get(
        f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/compare/",
        {"a": v1.number, "b": v2.number},
    ).json()
    assert (diff["added"], diff["removed"], diff["relabeled"], diff["unchanged"]) == (1, 1, 1, 1)
    job = api.post(
        f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/merge/",
        {"versions": [1, 2]},
        format="json",
    ).json()
    job = import_run(job["id"])
    merged = job.version
    missing = api.post(
        f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/merge/",
        {"versions": [1, 7]},
        format="json",
    )
    assert missing.status_code == 404 and "v7" in missing.json()["detail"]
    assert merged.source == "merge" and merged.parent == v1
    assert [m["number"] for m in merged.lineage["merged"]] == [1, 2]
    # 甲 appears in both with different labels: the first kept, the second a duplicate.
    assert merged.row_count == 4 and merged.duplicate_count == 2


def test_another_teams_dataset_is_404_and_viewers_cannot_create(
    api, make_user, make_team, team, dataset
):
    stranger = make_user("stranger")
    make_team("Other", {stranger: Role.OWNER})
    other = APIClient()
    other.force_authenticate(stranger)
    assert other.get(f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/").status_code == 404
    assert other.get(f"/api/v1/teams/other/datasets/{dataset.pk}/").status_code == 404
    viewer = make_user("viewer")
    Membership.objects.create(team=team, user=viewer, role=Role.VIEWER)
    v = APIClient()
    v.force_authenticate(viewer)
    assert v.get(f"/api/v1/teams/{team.slug}/datasets/").status_code == 200
    assert (
        v.post(
            f"/api/v1/teams/{team.slug}/datasets/", {"name": "x", "task_kind": "ner"}, format="json"
        ).status_code
        == 403
    )


def test_delete_removes_the_dataset_and_its_files(api, owner, team, dataset):
    version = make_version(dataset, owner)
    assert default_storage.exists(version.data_file)
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = api.delete(f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/")
    assert response.status_code == 204
    assert not default_storage.exists(version.data_file)
    assert AuditEvent.objects.filter(action="dataset.delete").exists()


def test_console_pages_show_a_version(client, owner, team, dataset):
    version = make_version(dataset, owner)
    client.force_login(owner)
    base = f"/t/{team.slug}/datasets/{dataset.pk}/v/{version.number}/"
    page = client.get(base).content.decode()
    assert 'data-testid="label-chart"' in page and "正面" in page
    rows = client.get(base + "rows/", {"label": "负面"}).content.decode()
    assert "很差" in rows and "很好" not in rows
    assert client.get(base + "report/").status_code == 200
    assert client.get(base + "download/nothing/").status_code == 404


def test_a_version_offers_its_next_steps_by_role(client, owner, team, dataset, make_user):
    from django.urls import reverse

    version = make_version(dataset, owner, [["text", "label"], ["房间干净", "正面"]] * 5)
    url = reverse("labeling:version", args=[team.slug, dataset.pk, version.number])
    client.force_login(owner)
    page = client.get(url).content.decode()
    train = reverse("training:job_new", args=[team.slug]) + f"?version={version.pk}"
    assert f'href="{train}" data-testid="train-link"' in page
    # The form it opens has the version chosen.
    form = client.get(train).content.decode()
    assert f'<option value="{version.pk}" selected>' in form
    viewer = make_user("kan")
    Membership.objects.create(team=team, user=viewer, role=Role.VIEWER)
    client.force_login(viewer)
    page = client.get(url).content.decode()
    assert 'data-testid="models-link"' in page and 'data-testid="train-link"' not in page
