"""Issue #22's story in the browser: a tiny Qwen2 and an ERNIE 4.5 imported as base models; two
LoRA versions of the Qwen2 (fine-tuned by the job runner), each evaluated on
an evaluation set from its model page by the real train worker, ranked on the set's
leaderboard (and its CSV); the first deployed, the second added as its adapter on the endpoint
page, a key made there, both called by name through the ``openai`` client, and the adapter
evaluated as the endpoint serves it, ranked beside the versions."""

import time

import openai
import pytest
from playwright.sync_api import Page, expect

from console.roles import Role
from deployment.reconcile import endpoints_reconcile
from labeling.datasets import dataset_create
from tests.helpers.browser import deploy, login, shot
from tests.helpers.data import make_version
from tests.helpers.models import chat_model_dir
from tests.helpers.serving import conversation

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

QUESTIONS = [
    ["question", "A", "B", "C", "D", "answer", "references", "subject"],
    ["3加4等于几？", "7", "8", "6", "5", "A", "", "加法"],
    ["5加6等于几？", "10", "11", "12", "9", "B", "", "加法"],
    ["2加2等于几？", "3", "5", "4", "6", "C", "", "算术"],
    ["1加2等于几？", "", "", "", "", "", '["1加2等于3。"]', "问答"],
]


def test_evaluate_two_lora_versions_rank_them_and_serve_both_from_one_revision(
    page: Page,
    live_server,
    make_user,
    make_team,
    model_version,
    lora_exports,
    train_worker,
    fresh_host,
):
    engineer = make_user("sun", password="Sun-Pass-2026")
    team = make_team("Models", {engineer: Role.MAINTAINER})
    exam = make_version(
        dataset_create(actor=engineer, team=team, name="算术评测", task_kind="evaluation"),
        engineer,
        QUESTIONS,
    )
    login(page, "sun", "Sun-Pass-2026")
    page.goto(f"/t/{team.slug}/base-models/")
    for arch, backend in (("qwen2", "paddle"), ("ernie4_5", "torch")):
        chat_model_dir(arch, backend)  # carried into the server's import directory
        form = page.get_by_test_id("import-form")
        form.locator("#id_name").fill(f"tiny-{arch}")
        form.locator("#id_backend").select_option(backend)
        form.locator("#id_path").fill(f"tiny-{arch}-{backend}")
        form.locator("button[type=submit]").click()
        row = page.get_by_test_id("base-models").locator("tr", has_text=f"tiny-{arch}")
        expect(row).to_contain_text(arch)
        expect(row.get_by_test_id("tested-with")).to_be_visible()
    versions = {}
    for name, kind in (("sums", "instruction"), ("prefs", "preference")):
        # The fixture's versions are LoRA fine-tunings of that Qwen2 (tests/deployment).
        v = model_version(kind, name=name, export=lora_exports[name], base="tiny-qwen2")
        v.team, v.created_by = team, engineer
        v.save()
        versions[name] = v

    for v in versions.values():
        page.goto(f"/t/{team.slug}/models/{v.pk}/")
        form = page.get_by_test_id("evaluate-form")
        form.get_by_test_id("evaluation-set").select_option(str(exam.pk))
        form.locator("input[name=max_new_tokens]").fill("8")
        form.get_by_test_id("evaluate").click()
        status = page.get_by_test_id("job-status")
        expect(status).to_have_attribute("data-status", "succeeded", timeout=180_000)
    page.goto(f"/t/{team.slug}/models/{versions['sums'].pk}/")
    expect(page.get_by_test_id("evaluations")).to_contain_text("算术评测")
    page.get_by_test_id("evaluations").get_by_role("link", name="排行榜").click()
    board = page.get_by_test_id("leaderboard")
    expect(board.locator("tbody tr")).to_have_count(2)
    for v in versions.values():
        expect(board.locator(f"tr[data-version='{v.pk}']")).to_be_visible()
    with page.expect_download() as download:
        page.get_by_test_id("leaderboard-csv").click()
    table = open(download.value.path(), encoding="utf-8-sig").read().splitlines()
    assert len(table) == 3 and table[0].startswith("rank,model_version")
    shot(page, "leaderboard")

    # The first version deployed; the second served beside it as its adapter.
    page.goto(f"/t/{team.slug}/models/{versions['sums'].pk}/")
    deploy(page, "family", "/v1/chat/completions")
    endpoint_page = page.url
    adapters = page.get_by_test_id("adapter-form")
    adapters.locator("#id_name").fill("prefs")
    adapters.locator("#id_model_version").select_option(str(versions["prefs"].pk))
    adapters.locator("button[type=submit]").click()
    state = page.get_by_test_id("adapter-state")
    deadline = time.monotonic() + 60
    while state.get_attribute("data-state") != "ready":
        assert time.monotonic() < deadline, state.get_attribute("data-state")
        endpoints_reconcile()
        time.sleep(0.5)
        page.reload()
    keys = page.get_by_test_id("key-form")
    keys.locator("#id_name").fill("app")
    keys.locator("button[type=submit]").click()
    key = page.get_by_test_id("new-key").text_content()
    endpoints_reconcile()
    shot(page, "endpoint-adapters")
    api = openai.OpenAI(base_url=f"{fresh_host.url}/v1", api_key=key, max_retries=0, timeout=60)
    for model in ("family", "family/prefs"):
        answer = api.chat.completions.create(
            model=model, messages=conversation("3加4等于几？"), max_tokens=4, temperature=0
        )
        assert answer.model == model and answer.usage.prompt_tokens > 0

    # The adapter as applications call it, evaluated from the endpoint page through its API,
    # and ranked on the set's leaderboard beside the two versions' own evaluations.
    page.goto(endpoint_page)
    form = page.get_by_test_id("endpoint-evaluate-form")
    form.locator("#id_evaluation_set").select_option(str(exam.pk))
    form.locator("#id_adapter").select_option("prefs")
    form.locator("#id_max_new_tokens").fill("8")
    form.get_by_test_id("endpoint-evaluate").click()
    status = page.get_by_test_id("evaluation-status")
    expect(status).to_have_attribute("data-status", "done", timeout=60_000)  # refreshes itself
    expect(page.get_by_test_id("evaluated-endpoint")).to_contain_text("family/prefs")
    expect(page.get_by_test_id("evaluation-metrics")).to_contain_text("accuracy_generation")
    page.get_by_role("link", name="排行榜").click()
    board = page.get_by_test_id("leaderboard")
    expect(board.locator("tbody tr")).to_have_count(3)
    expect(board.locator("tr[data-endpoint='family/prefs']")).to_be_visible()
    shot(page, "leaderboard-with-endpoint")
