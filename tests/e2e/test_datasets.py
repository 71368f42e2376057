"""An ML engineer uploads a GBK CSV, maps its columns, waits for the import on the real Celery
worker, reads the report and the charts, and browses the rows."""

import pytest
from playwright.sync_api import Page, expect

from console.models import Membership
from console.roles import Role
from labeling.models import DatasetVersion
from tests.helpers.browser import login, new_dataset, shot, upload_gbk_csv

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROWS = (
    [("评论内容", "情感")]
    + [
        ("房间干净整洁，服务周到", "好评"),
        ("早餐很差，隔音也不好", "差评"),
        ("位置方便，交通便利", "好评"),
        ("", "差评"),  # empty text: rejected, row 5
        ("前台态度冷淡", "差评"),
        ("房间干净整洁，服务周到", "好评"),  # duplicate of row 2
        ("价格实惠，性价比高", ""),  # unlabeled: kept for labeling
    ]
    + [(f"第{i}条评论：整体体验不错", "好评" if i % 2 else "差评") for i in range(40)]
)


def test_upload_gbk_csv_map_import_and_browse(
    page: Page, make_user, make_team, tmp_path, celery_worker_process
):
    engineer = make_user("li", password="Li-Pass-2026")
    team = make_team("NLP", {engineer: Role.MAINTAINER})
    assert Membership.objects.filter(team=team).count() == 1
    path = tmp_path / "酒店评论.csv"
    path.write_bytes("\r\n".join(",".join(r) for r in ROWS).encode("gbk"))

    login(page, "li", "Li-Pass-2026")
    new_dataset(page, "酒店评论")
    # The mapping page: GBK detected, the header mapped; the import runs on the worker.
    upload_gbk_csv(page, path, preview="房间干净整洁", shot_as="mapping")
    expect(page.get_by_test_id("report")).to_have_count(0)
    page.get_by_test_id("version-link").click()
    expect(page.get_by_test_id("row-count")).to_have_text("45")
    expect(page.get_by_test_id("label-chart")).to_contain_text("好评")
    expect(page.get_by_test_id("length-chart")).to_be_visible()
    expect(page.get_by_test_id("splits")).to_contain_text("训练集")
    shot(page, "version")

    page.get_by_role("link", name="报告").click()
    report = page.get_by_test_id("report")
    expect(report.locator('tr[data-reason="empty_text"] td').first).to_have_text("5")
    expect(report.locator('tr[data-reason="duplicate"] td').first).to_have_text("7")

    page.get_by_role("link", name="行", exact=True).click()
    rows = page.get_by_test_id("rows")
    expect(rows.locator("tbody tr")).to_have_count(45)
    page.get_by_label("标签").select_option("差评")
    page.get_by_role("button", name="筛选").click()
    expect(rows).to_contain_text("早餐很差")
    expect(rows).not_to_contain_text("位置方便")
    page.get_by_label("搜索").fill("前台")
    page.get_by_role("button", name="筛选").click()
    expect(rows.locator("tbody tr")).to_have_count(1)
    shot(page, "rows")
    assert DatasetVersion.objects.get().encoding == "gbk"


def test_browser_upload_resumes_after_a_dropped_chunk(
    page: Page, make_user, make_team, tmp_path, settings
):
    """The console's uploader: a chunk lost on the way is resumed from the server's offset."""
    from labeling.datasets import dataset_create
    from labeling.models import Upload

    settings.UPLOAD_CHUNK_BYTES = 256
    engineer = make_user("zhang", password="Zhang-Pass-2026")
    team = make_team("Risk", {engineer: Role.MAINTAINER})
    dataset = dataset_create(
        actor=engineer, team=team, name="评论", task_kind="text_classification"
    )
    data = "\n".join(",".join(r) for r in ROWS).encode("gbk")
    path = tmp_path / "reviews.csv"
    path.write_bytes(data)

    seen = {"put": 0, "get": 0}

    def flaky(route):
        method = route.request.method
        if method == "PUT":
            seen["put"] += 1
            if seen["put"] == 2:  # the connection drops during the second chunk
                return route.abort("connectionreset")
        elif method == "GET":
            seen["get"] += 1
        return route.continue_()

    page.route("**/api/v1/teams/*/uploads/*/", flaky)
    login(page, "zhang", "Zhang-Pass-2026")
    page.goto(f"/t/{team.slug}/datasets/{dataset.pk}/")
    page.get_by_label("文件").set_input_files(str(path))
    page.get_by_role("button", name="上传", exact=True).click()
    expect(page.get_by_test_id("detected-encoding")).to_contain_text("GBK", timeout=30_000)
    upload = Upload.objects.get()
    assert upload.status == "complete" and upload.size == len(data)
    assert seen["get"] >= 1 and seen["put"] > len(data) // 256
    from django.core.files.storage import default_storage

    with default_storage.open(upload.storage_name, "rb") as f:
        assert f.read() == data
