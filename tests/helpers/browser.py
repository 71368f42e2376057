"""The browser tests' steps (Playwright): logging in, the console's forms for datasets,
imports, labeling projects, jobs and deployments, screenshots."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page


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


def new_dataset(page: Page, name: str, labels: str = "", navigate: bool = True) -> None:
    """A text-classification dataset made on the datasets page (reached by the navigation,
    unless the page is there already); its page."""
    from playwright.sync_api import expect

    if navigate:
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
