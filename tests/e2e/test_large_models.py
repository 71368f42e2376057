"""The large-model chain in the browser: an annotator writes a response in the real Label
Studio, the engineer exports the instruction version, fine-tunes the tiny LLaMA preset with
LoRA on the real train worker, deploys it, and chats with it in the console's playground."""

import re

import pytest
from playwright.sync_api import Page, expect

from console.roles import Role
from labeling.datasets import dataset_create
from labeling.models import DatasetVersion, LabelingProject
from tests.helpers.browser import (
    deploy,
    export_labeled,
    login,
    new_labeling_project,
    new_user_page,
    open_label_studio,
    shot,
    submit_job,
)
from tests.helpers.data import make_jsonl_version, rows_for
from tests.helpers.label_studio import needs_label_studio
from training.models import TrainingJob

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True), needs_label_studio]


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
    new_labeling_project(page, "写回答", selection="unlabeled")
    project = LabelingProject.objects.get()
    assert project.tasks.count() == 1

    # The annotator writes the response in Label Studio, reached through the console.
    context, annotator_page = new_user_page(browser, live_server.url)
    login(annotator_page, "qian", "Qian-Pass-2026")
    annotator_page.goto(f"/t/{team.slug}/labeling/{project.pk}/")
    ls_page = open_label_studio(annotator_page)
    expect(ls_page.get_by_text("9加9等于几？")).to_be_visible()
    response = ls_page.get_by_placeholder("助手的回答")
    response.fill("9加9等于18。")
    response.press("Enter")  # Label Studio adds the text as the response
    ls_page.get_by_test_id("bottombar-submit-button").click()
    shot(ls_page, "label-studio-response")
    context.close()

    export_labeled(page, "qian")
    exported = DatasetVersion.objects.get(source="labeling")
    assert exported.stats["unlabeled"] == 0

    # Fine-tune the tiny LLaMA preset with LoRA (the task kind's default) on the export.
    page.goto(f"/t/{team.slug}/training/")
    submit_job(page, exported, epochs=6)
    status = page.get_by_test_id("job-status")
    expect(status).to_have_attribute("data-status", "succeeded", timeout=180_000)
    job = TrainingJob.objects.get()
    assert job.preset == "llama-tiny-char" and job.hyperparameters["method"] == "lora"

    # Its evaluation shows generations beside the references.
    page.get_by_test_id("model-link").get_by_role("link").click()
    expect(page.get_by_test_id("generations")).to_contain_text("等于")
    shot(page, "large-model-evaluation")

    # Deploy it, and chat in the playground once the serving host has it ready.
    deploy(page, "math-helper", "/v1/chat/completions")

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
