"""The large-model chain in the browser: an annotator writes a response in the real Label
Studio, the engineer exports the instruction version, fine-tunes the tiny LLaMA preset with
LoRA on the real train worker, deploys it, and chats with it in the console's playground."""

import os
import re

import pytest
from playwright.sync_api import Page, expect

from console.roles import Role
from labeling.datasets import dataset_create
from labeling.models import DatasetVersion, LabelingProject
from tests.helpers import login, make_jsonl_version, rows_for, shot, wait_endpoint_ready
from training.models import TrainingJob

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("LABEL_STUDIO_URL"), reason="needs Label Studio"),
]


def test_write_a_response_train_deploy_and_chat(
    page: Page, browser, live_server, make_user, make_team, train_worker, fresh_host
):
    engineer = make_user("zhao", password="Zhao-Pass-2026")
    annotator = make_user("qian", password="Qian-Pass-2026")
    team = make_team("LLM", {engineer: Role.MAINTAINER, annotator: Role.ANNOTATOR})
    dataset = dataset_create(actor=engineer, team=team, name="算术问答", task_kind="instruction")
    rows, mapping = rows_for("instruction", 81)
    waiting = {"messages": [{"role": "user", "content": "9加9等于几？"}]}
    version = make_jsonl_version(dataset, engineer, [*rows, waiting], mapping)
    assert version.stats["unlabeled"] == 1

    # The engineer sends the conversation that awaits its response to Label Studio.
    login(page, "zhao", "Zhao-Pass-2026")
    page.goto(f"/t/{team.slug}/datasets/{dataset.pk}/v/{version.number}/")
    page.get_by_test_id("label-link").click()
    form = page.get_by_test_id("new-project")
    form.get_by_label("名称").fill("写回答")
    form.locator("#id_selection").select_option("unlabeled")
    form.get_by_role("button", name="在 Label Studio 中创建").click()
    expect(page.get_by_test_id("project-status")).to_have_text("就绪", timeout=60_000)
    project = LabelingProject.objects.get()
    assert project.tasks.count() == 1

    # The annotator writes the response in Label Studio, reached through the console.
    context = browser.new_context(base_url=live_server.url, locale="zh-CN")
    annotator_page = context.new_page()
    login(annotator_page, "qian", "Qian-Pass-2026")
    annotator_page.goto(f"/t/{team.slug}/labeling/{project.pk}/")
    with context.expect_page() as opened:
        annotator_page.get_by_test_id("open-ls").click()
    ls_page = opened.value
    ls_page.set_default_timeout(30_000)
    expect(ls_page.get_by_text("9加9等于几？")).to_be_visible()
    response = ls_page.get_by_placeholder("助手的回答")
    response.fill("9加9等于18。")
    response.press("Enter")  # Label Studio adds the text as the response
    ls_page.get_by_test_id("bottombar-submit-button").click()
    shot(ls_page, "label-studio-response")
    context.close()

    expect(page.get_by_test_id("per-annotator")).to_contain_text("qian", timeout=30_000)
    page.reload()
    page.get_by_test_id("export").get_by_role("button", name="导出为新版本").click()
    expect(page.get_by_test_id("import-status")).to_have_text("成功", timeout=60_000)
    exported = DatasetVersion.objects.get(source="labeling")
    assert exported.stats["unlabeled"] == 0

    # Fine-tune the tiny LLaMA preset with LoRA (the task kind's default) on the export.
    page.goto(f"/t/{team.slug}/training/")
    page.get_by_test_id("new-job").click()
    job_form = page.get_by_test_id("job-form")
    job_form.locator("#id_dataset_version").select_option(str(exported.pk))
    job_form.locator("#id_epochs").fill("6")
    page.get_by_test_id("submit-job").click()
    status = page.get_by_test_id("job-status")
    expect(status).to_have_attribute("data-status", "succeeded", timeout=180_000)
    job = TrainingJob.objects.get()
    assert job.preset == "llama-tiny-char" and job.hyperparameters["method"] == "lora"

    # Its evaluation shows generations beside the references.
    page.get_by_test_id("model-link").get_by_role("link").click()
    expect(page.get_by_test_id("generations")).to_contain_text("等于")
    shot(page, "large-model-evaluation")

    # Deploy it, and chat in the playground once the serving host has it ready.
    page.get_by_test_id("deploy").click()
    deploy = page.get_by_test_id("deploy-form")
    deploy.locator("#id_name").fill("math-helper")
    deploy.locator("button[type=submit]").click()
    expect(page.get_by_test_id("endpoint-url")).to_contain_text("/v1/chat/completions")
    wait_endpoint_ready(page)

    page.get_by_test_id("chat-input").fill("3加4等于几？")
    page.locator("#chat-temperature").fill("0")
    page.get_by_test_id("chat-send").click()
    reply = page.locator(".chat-assistant")
    expect(reply).to_contain_text("等于", timeout=30_000)
    expect(page.get_by_test_id("chat-stats")).to_contain_text("TTFT")
    # A second turn carries the conversation (the model, trained on single turns, answers as
    # it can).
    page.get_by_test_id("chat-input").fill("5加2等于几？")
    with page.expect_request("**/chat/") as sent:
        page.get_by_test_id("chat-send").click()
    messages = sent.value.post_data_json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == reply.first.text_content()
    second = page.locator(".chat-assistant").nth(1)
    expect(second).not_to_have_class(re.compile(r"\bstreaming\b"), timeout=30_000)
    expect(second).not_to_be_empty()
    # The playground's calls are on the endpoint's charts: tokens/s and time to first token.
    expect(page.locator("[data-k=requests]")).to_have_text("2", timeout=20_000)
    expect(page.locator("#tokens-chart polyline")).to_have_count(1)
    shot(page, "chat-playground")
