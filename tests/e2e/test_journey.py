"""The whole chain as a new team lives it, in a real browser against the real processes: an
administrator sets up a team, an engineer uploads a GBK CSV of Chinese hotel reviews with a few
unlabeled rows, an annotator labels them in the real Label Studio, the engineer exports the
labeled version, trains a preset model on the real train worker, reads its report, deploys it,
calls it from outside the browser with an API key, rolls out a second model version as a 10 %
canary, promotes it, rolls back, and pre-annotates new rows with the endpoint; the owner finds
every step in the audit log.

The walkthrough in docs/journey.md is this test, with the screenshots it takes
(``E2E_SCREENSHOTS=docs/images``)."""

import re
import time
from pathlib import Path

import pytest
import requests
from playwright.sync_api import Browser, Page, expect

from console.models import Team
from deployment.models import Endpoint
from deployment.reconcile import endpoints_reconcile
from labeling import label_studio
from labeling.models import DatasetVersion, LabelingProject
from tests.helpers.browser import (
    admin_creates_team,
    deploy,
    export_labeled,
    login,
    new_dataset,
    new_labeling_project,
    new_user_page,
    open_label_studio,
    open_report,
    shot,
    submit_job,
    upload_gbk_csv,
    wait_endpoint_ready,
)
from tests.helpers.label_studio import needs_label_studio
from training.models import TrainingJob

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True), needs_label_studio]

POSITIVE = ["干净整洁", "服务热情", "床很舒适", "交通方便", "早餐丰盛"]
NEGATIVE = ["隔音很差", "前台冷淡", "卫生脏乱", "非常失望", "设施陈旧"]
PLACES = ["房间", "大堂", "这次入住", "酒店", "整体感觉", "周末住了两晚", "出差选的这家"]
# Rows the team has not labeled yet: the annotator labels them in Label Studio.
UNLABELED = {"房间宽敞明亮，服务热情周到": "好评", "晚上隔音很差，一夜没睡好": "差评"}
# Rows that arrive later: the deployed model pre-annotates them.
NEW_ROWS = {
    "前台冷淡，卫生脏乱": "差评",
    "床很舒适，早餐丰盛": "好评",
    "设施陈旧，非常失望": "差评",
}


def reviews(n: int = 64) -> list[tuple[str, str]]:
    """Reviews whose sentiment a phrase decides, so the preset model learns it in a few
    epochs; numbered, so that none is a duplicate of another."""
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        phrase = (POSITIVE if positive else NEGATIVE)[(i // 2) % 5]
        rows.append(
            (f"{PLACES[i % len(PLACES)]}{phrase}，第{i + 1}条", "好评" if positive else "差评")
        )
    return rows


def gbk_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    lines = ["评论内容,情感", *(f"{text},{label}" for text, label in rows)]
    path.write_bytes("\r\n".join(lines).encode("gbk"))
    return path


def served_by(url: str, key: str, model: str) -> dict:
    """Call the endpoint as an application does until ``model`` answers (the hosts follow a
    change of the traffic split once the reconciler has told them); its answer."""
    deadline = time.monotonic() + 60
    while True:
        r = requests.post(
            url,
            json={"inputs": ["房间干净整洁，服务热情"]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        if r.json()["model"] == model:
            return r.json()
        assert time.monotonic() < deadline, f"{model} never answered: {r.json()}"
        endpoints_reconcile()
        time.sleep(0.3)


def label_in_label_studio(ls_page: Page, answers: dict[str, str]) -> None:
    """Label each task Label Studio serves with the sentiment its text states."""
    remaining = dict(answers)
    while remaining:
        shown = ls_page.get_by_text(re.compile("|".join(map(re.escape, remaining))))
        expect(shown).to_be_visible()
        text = next(t for t in remaining if t in shown.inner_text())
        # Label Studio shows each choice with its hotkey: "好评[1]".
        ls_page.get_by_text(remaining.pop(text)).first.click()
        ls_page.get_by_test_id("bottombar-submit-button").click()
        expect(ls_page.get_by_text(text)).to_have_count(0)


def test_a_new_team_walks_the_whole_chain(
    page: Page,
    browser: Browser,
    live_server,
    tmp_path,
    celery_worker_process,
    train_worker,
    fresh_host,
):
    base = live_server.url

    # -- 1. The administrator makes the team and its accounts, and invites them. ------------
    admin_creates_team(page, "酒店点评组")
    team = Team.objects.get(name="酒店点评组")
    shot(page, "journey-01-team")

    page.get_by_role("link", name="账号管理").click()
    for username, password in (("li", "Li-Pass-2026"), ("xiao", "Xiao-Pass-2026")):
        page.get_by_label("用户名").fill(username)
        page.get_by_label("初始密码").fill(password)
        page.get_by_role("button", name="创建账号").click()
        expect(page.get_by_role("status")).to_contain_text(f"账号“{username}”已创建")
    expect(page.locator('tr[data-user="xiao"]')).to_be_visible()
    shot(page, "journey-02-accounts")

    page.get_by_role("link", name="模型平台").click()  # the header's brand: the last team
    page.get_by_role("navigation").get_by_role("link", name="成员").click()
    invite = page.get_by_test_id("invite")
    for username, role in (("li", "maintainer"), ("xiao", "annotator")):
        invite.get_by_label("用户名").fill(username)
        invite.get_by_label("角色").select_option(role)
        invite.get_by_role("button", name="邀请").click()
        expect(page.locator(f'tr[data-member="{username}"]')).to_be_visible()
    expect(page.get_by_role("status")).to_contain_text("xiao 已以标注员身份加入团队")
    shot(page, "journey-03-members")

    # -- 2. The engineer uploads a GBK CSV with some unlabeled rows. -----------------------
    li_context, li = new_user_page(browser, base)
    login(li, "li", "Li-Pass-2026")
    expect(li.get_by_role("heading", name="酒店点评组")).to_be_visible()
    # From here to a served model the engineer types no address: the dashboard's guide, the
    # navigation and the links of each page lead the way.
    guide = li.get_by_test_id("first-run")
    expect(guide.locator('li[aria-current="step"]')).to_contain_text("上传数据集")
    shot(li, "journey-02b-guide")
    guide.get_by_role("link", name="上传数据集").click()
    new_dataset(li, "酒店评论", labels="好评, 差评", navigate=False)

    rows = reviews()
    for position, text in zip((2, 6), UNLABELED, strict=True):
        rows.insert(position, (text, ""))
    upload = gbk_csv(tmp_path / "酒店评论.csv", rows)
    upload_gbk_csv(li, upload, preview="房间宽敞明亮", shot_as="journey-04-mapping")
    li.get_by_test_id("version-link").click()
    expect(li.get_by_test_id("row-count")).to_have_text(str(len(rows)))
    expect(li.get_by_test_id("label-chart")).to_contain_text("好评")
    shot(li, "journey-05-version")
    uploaded = DatasetVersion.objects.get(dataset__team=team, number=1)
    assert uploaded.encoding == "gbk"

    # -- 3. A labeling project of the unlabeled rows; the annotator labels them. -----------
    new_labeling_project(li, "第一轮", selection="unlabeled")
    project = LabelingProject.objects.get(team=team)
    assert project.tasks.count() == len(UNLABELED)

    xiao_context, xiao = new_user_page(browser, base)
    login(xiao, "xiao", "Xiao-Pass-2026")
    xiao.get_by_role("navigation").get_by_role("link", name="数据标注").click()
    xiao.get_by_role("link", name="第一轮").click()
    ls_page = open_label_studio(xiao)
    shown = ls_page.get_by_text(re.compile("|".join(UNLABELED)))
    expect(shown).to_be_visible()
    shot(ls_page, "journey-06-label-studio")
    label_in_label_studio(ls_page, UNLABELED)
    ls_page.close()

    # The webhooks bring the annotations: the project page shows them, attributed.
    per_annotator = li.get_by_test_id("per-annotator")
    expect(per_annotator.locator("td")).to_have_text(str(len(UNLABELED)), timeout=30_000)

    # -- 4. Export a labeled version, train the preset on it, read the report. -------------
    export_labeled(li, "xiao", shot_as="journey-07-labeled")
    labeled = DatasetVersion.objects.get(dataset__team=team, number=2)
    assert labeled.parent == uploaded
    assert labeled.stats["labels"] == {"好评": 33, "差评": 33}

    li.get_by_role("navigation").get_by_role("link", name="模型训练").click()
    submit_job(
        li,
        labeled,
        model="preset:ernie-micro-char",
        shot_as="journey-08-new-job",
        epochs=8,
        batch_size=8,
        seed=1,
    )
    status = li.get_by_test_id("job-status")
    expect(status).to_have_attribute("data-status", "succeeded", timeout=180_000)
    shot(li, "journey-09-job")
    first_job = TrainingJob.objects.get(team=team)

    # The second model version (another seed, more epochs) trains while the first is deployed.
    li.get_by_test_id("clone").click()
    form = li.get_by_test_id("job-form")
    form.locator("#id_seed").fill("2")
    form.locator("#id_epochs").fill("10")
    form.get_by_test_id("submit-job").click()
    expect(li.get_by_test_id("job-status")).to_be_visible()
    second_job = TrainingJob.objects.exclude(pk=first_job.pk).get(team=team)

    li.get_by_role("navigation").get_by_role("link", name="模型训练").click()
    li.locator(f'[data-testid="jobs"] a[href$="/training/{first_job.pk}/"]').click()
    open_report(li, ("差评", "好评"), "酒店评论 v2")
    shot(li, "journey-10-report")

    # -- 5. Deploy it, call it from outside the browser, see the call on the charts. -------
    deploy(li, "hotel-reviews", "/v1/endpoints/hotel-reviews:predict", timeout=120)

    keys = li.get_by_test_id("key-form")
    keys.locator("#id_name").fill("客服系统")
    keys.locator("button[type=submit]").click()
    key = li.get_by_test_id("new-key").text_content()
    url = li.get_by_test_id("endpoint-url").text_content().removeprefix("POST ").strip()
    # A new key reaches the serving host with the next convergence (queued at once): an
    # application that calls in the first seconds may get a 401 and tries again.
    deadline, calls = time.monotonic() + 60, 0
    while True:
        calls += 1
        answer = requests.post(
            url,
            json={"inputs": ["前台冷淡，隔音很差"]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        if answer.status_code != 401 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "酒店评论 v1"
    assert answer.json()["outputs"][0]["label"] in ("好评", "差评")
    # The call is counted on the charts (the page polls the metrics every 5 s).
    expect(li.locator("[data-k=requests]")).to_have_text(str(calls), timeout=30_000)
    expect(li.locator("#qps-chart polyline")).to_have_count(1)
    shot(li, "journey-11-endpoint")
    endpoint_page = li.url

    # -- 6. The second model version as a 10 % canary; promoted; rolled back. --------------
    # The dashboard now shows the team's work: the endpoint with its last hour, the jobs, the
    # models with their figure, the labeling project, the storage and what was done.
    li.get_by_role("navigation").get_by_role("link", name="概览").click()
    expect(li.locator('[data-panel="endpoints"]')).to_contain_text("hotel-reviews")
    expect(li.locator('[data-panel="models"]')).to_contain_text("酒店评论 v1")
    expect(li.locator('[data-panel="labeling"]')).to_contain_text("第一轮")
    expect(li.get_by_test_id("first-run")).to_have_count(0)
    shot(li, "journey-11b-overview")
    li.get_by_role("navigation").get_by_role("link", name="模型训练").click()
    li.locator(f'[data-testid="jobs"] a[href$="/training/{second_job.pk}/"]').click()
    expect(li.get_by_test_id("job-status")).to_have_attribute(
        "data-status", "succeeded", timeout=180_000
    )
    li.get_by_role("navigation").get_by_role("link", name="推理服务").click()
    li.get_by_role("link", name="hotel-reviews").click()
    assert endpoint_page.startswith(li.url)
    canary = li.get_by_test_id("canary-form")
    canary.locator("#id_model_version").select_option(label="酒店评论 v2")
    expect(canary.locator("#id_weight")).to_have_value("10")
    # The quality gate's preview: v2 beside the serving v1 on the same test split.
    expect(li.get_by_test_id("canary-preview").locator("table")).to_be_visible()
    with li.expect_navigation():
        canary.locator("button[type=submit]").click()
    # A v2 worse than v1 is shown first with the warning: the user confirms.
    if li.get_by_test_id("confirm-worse").count():
        expect(li.get_by_test_id("worse-warning")).to_be_visible()
        li.get_by_test_id("confirm-worse").click()
    revisions = li.get_by_test_id("revisions")
    expect(revisions.locator('tr[data-revision="1"] [data-testid=weight]')).to_have_text("90")
    expect(revisions.locator('tr[data-revision="2"] [data-testid=weight]')).to_have_text("10")
    wait_endpoint_ready(li, timeout=120)
    shot(li, "journey-12-canary")

    if li.locator('tr[data-revision="2"] form[data-confirm]').count():
        li.once("dialog", lambda dialog: dialog.accept())  # promoting a worse version: sure
    li.locator('tr[data-revision="2"]').get_by_test_id("promote").click()
    expect(revisions.locator('tr[data-revision="2"] [data-testid=weight]')).to_have_text("100")
    expect(revisions.locator('tr[data-revision="1"]')).to_have_attribute("data-status", "retired")
    served_by(url, key, "酒店评论 v2")
    li.reload()
    shot(li, "journey-13-promoted")

    li.get_by_test_id("rollback").click()
    expect(revisions.locator('tr[data-revision="1"] [data-testid=weight]')).to_have_text("100")
    expect(revisions.locator('tr[data-revision="2"]')).to_have_attribute("data-status", "retired")
    served_by(url, key, "酒店评论 v1")
    li.reload()
    shot(li, "journey-14-rolled-back")

    # -- 7. New rows arrive: the endpoint pre-annotates them for the annotators. -----------
    li.goto(f"/t/{team.slug}/datasets/{uploaded.dataset_id}/")
    upload_gbk_csv(li, gbk_csv(tmp_path / "新评论.csv", [(t, "") for t in NEW_ROWS]))
    li.get_by_test_id("version-link").click()
    expect(li.get_by_test_id("row-count")).to_have_text(str(len(NEW_ROWS)))
    new_labeling_project(li, "第二轮")
    second = LabelingProject.objects.get(team=team, name="第二轮")

    li.reload()  # the project's actions come with a ready project
    li.get_by_test_id("preannotate").click()
    form = li.get_by_test_id("preannotate-form")
    endpoint = Endpoint.objects.get(team=team, name="hotel-reviews")
    expect(form.locator("select")).to_contain_text("hotel-reviews")
    form.locator("select").select_option(str(endpoint.pk))
    shot(li, "journey-15-preannotate")
    form.get_by_role("button", name="预标注").click()
    expect(li.get_by_role("status")).to_be_visible()
    # The worker sends the tasks to the endpoint and puts the answers into Label Studio.
    predicted: dict[str, tuple[str, float]] = {}
    deadline = time.monotonic() + 60
    while len(predicted) < len(NEW_ROWS):
        assert time.monotonic() < deadline, predicted
        time.sleep(0.5)
        for task in label_studio.client(second.team).tasks.list(
            project=second.ls_project_id, fields="all"
        ):
            for p in task.predictions or []:
                data = p if isinstance(p, dict) else p.model_dump()
                if data["model_version"].startswith("hotel-reviews:"):
                    choice = data["result"][0]["value"]["choices"][0]
                    predicted[task.data["text"]] = (choice, data["score"])
    assert {text: label for text, (label, _score) in predicted.items()} == NEW_ROWS
    assert all(0.5 <= score <= 1 for _label, score in predicted.values())

    # The annotator finds the model's answer already filled in.
    xiao.goto(f"/t/{team.slug}/labeling/{second.pk}/")
    ls_page = open_label_studio(xiao)
    shown = ls_page.get_by_text(re.compile("|".join(NEW_ROWS)))
    expect(shown).to_be_visible()
    text = next(t for t in NEW_ROWS if t in shown.inner_text())
    choice = ls_page.get_by_role("checkbox", name=re.compile(f"^{NEW_ROWS[text]}"))
    expect(choice).to_be_checked()
    shot(ls_page, "journey-16-predictions")
    xiao_context.close()
    li_context.close()

    # -- 8. The owner finds every step in the audit log. -----------------------------------
    page.goto(f"/t/{team.slug}/audit/")
    audit = page.get_by_test_id("audit")
    for action in (
        "login",
        "team.create",
        "membership.add",
        "dataset.create",
        "dataset_version.create",
        "labeling_project.create",
        "labeling_project.annotations",
        "labeling_project.export",
        "training.job_submit",
        "endpoint.deploy",
        "endpoint.key_create",
        "endpoint.canary",
        "endpoint.promote",
        "endpoint.rollback",
        "labeling_project.preannotate_start",
        "labeling_project.preannotate",
    ):
        expect(audit.locator(f'tr[data-action="{action}"]').first).to_be_visible()
    expect(audit.locator('tr[data-action="labeling_project.annotations"]').first).to_contain_text(
        "xiao"
    )
    expect(audit.locator('tr[data-action="training.job_submit"]')).to_have_count(2)
    shot(page, "journey-17-audit")
