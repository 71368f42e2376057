"""A maintainer makes a labeling project from the console; an annotator labels a task in the
real Label Studio page, reached through the console; the maintainer sees the progress and
exports a new version."""

import pytest
from playwright.sync_api import Page, expect

from console.roles import Role
from labeling.models import DatasetVersion, LabelingProject
from tests.helpers.browser import (
    export_labeled,
    login,
    new_labeling_project,
    new_user_page,
    open_label_studio,
    shot,
)
from tests.helpers.data import make_version, reviews_dataset
from tests.helpers.label_studio import needs_label_studio

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True), needs_label_studio]


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
    new_labeling_project(page, "第一轮")
    project = LabelingProject.objects.get()

    # The annotator, in a browser of their own, goes to Label Studio through the console.
    context, annotator_page = new_user_page(browser, live_server.url)
    login(annotator_page, "xiao", "Xiao-Pass-2026")
    annotator_page.goto(f"/t/{team.slug}/labeling/{project.pk}/")
    ls_page = open_label_studio(annotator_page)
    expect(ls_page.get_by_text("房间干净整洁")).to_be_visible()
    # Label Studio shows each choice with its hotkey: "正面[1]".
    ls_page.get_by_text("正面").first.click()
    ls_page.get_by_test_id("bottombar-submit-button").click()
    shot(ls_page, "label-studio")
    context.close()

    # The webhook brings the annotation; the project page shows it, attributed.
    export_labeled(page, "xiao")
    exported = DatasetVersion.objects.get(source="labeling")
    assert exported.parent == version and exported.stats["labels"] == {"正面": 1}
    shot(page, "export")
