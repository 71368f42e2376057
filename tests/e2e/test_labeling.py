"""A maintainer makes a labeling project from the console; an annotator labels a task in the
real Label Studio page, reached through the console; the maintainer sees the progress and
exports a new version."""

import os

import pytest
from playwright.sync_api import Page, expect

from console.roles import Role
from labeling.models import DatasetVersion, LabelingProject
from tests.helpers import login, make_version, reviews_dataset, shot

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("LABEL_STUDIO_URL"), reason="needs Label Studio"),
]


def test_label_in_label_studio_and_export(
    page: Page, browser, live_server, make_user, make_team, celery_worker_process
):
    engineer = make_user("li", password="Li-Pass-2026")
    annotator = make_user("xiao", password="Xiao-Pass-2026")
    team = make_team("Hotel", {engineer: Role.MAINTAINER, annotator: Role.ANNOTATOR})
    dataset = reviews_dataset(team, engineer, "酒店评论")
    version = make_version(dataset, engineer, [["text", "label"], ["房间干净整洁", ""]])

    login(page, "li", "Li-Pass-2026")
    page.goto(f"/t/{team.slug}/datasets/{dataset.pk}/v/{version.number}/")
    page.get_by_test_id("label-link").click()
    form = page.get_by_test_id("new-project")
    form.get_by_label("名称").fill("第一轮")
    form.get_by_role("button", name="在 Label Studio 中创建").click()
    expect(page.get_by_test_id("project-status")).to_have_text("就绪", timeout=60_000)
    project = LabelingProject.objects.get()

    # The annotator, in a browser of their own, goes to Label Studio through the console.
    context = browser.new_context(base_url=live_server.url, locale="zh-CN")
    annotator_page = context.new_page()
    login(annotator_page, "xiao", "Xiao-Pass-2026")
    annotator_page.goto(f"/t/{team.slug}/labeling/{project.pk}/")
    with context.expect_page() as opened:
        annotator_page.get_by_test_id("open-ls").click()
    ls_page = opened.value
    ls_page.set_default_timeout(30_000)
    expect(ls_page.get_by_text("房间干净整洁")).to_be_visible()
    # Label Studio shows each choice with its hotkey: "正面[1]".
    ls_page.get_by_text("正面").first.click()
    ls_page.get_by_test_id("bottombar-submit-button").click()
    shot(ls_page, "label-studio")
    context.close()

    # The webhook brings the annotation; the project page shows it, attributed.
    expect(page.get_by_test_id("per-annotator")).to_contain_text("xiao", timeout=30_000)
    page.reload()  # the export form comes with a ready project
    page.get_by_test_id("export").get_by_role("button", name="导出为新版本").click()
    expect(page.get_by_test_id("import-status")).to_have_text("成功", timeout=60_000)
    exported = DatasetVersion.objects.get(source="labeling")
    assert exported.parent == version and exported.stats["labels"] == {"正面": 1}
    shot(page, "export")
