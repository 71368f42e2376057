"""An ML engineer deploys a model version from the console, waits for it to be ready, uses the
try-it box, creates an API key, calls the endpoint from outside the browser, and sees the calls
counted on the endpoint's charts."""

import pytest
import requests
from playwright.sync_api import Page, expect

from tests.helpers.browser import login, shot, wait_endpoint_ready

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_deploy_try_it_and_see_the_calls_on_the_charts(
    page: Page,
    owner,
    team,
    model_version,
    fresh_host,
    celery_worker_process,
):
    version = model_version()
    login(page, "olivia", "pw-Secret-123")
    page.goto(f"/t/{team.slug}/models/{version.pk}/")
    page.get_by_test_id("deploy").click()
    form = page.get_by_test_id("deploy-form")
    form.locator("#id_name").fill("e2e-reviews")
    shot(page, "deployment-new")
    form.locator("button[type=submit]").click()
    expect(page.get_by_test_id("endpoint-url")).to_contain_text("/v1/endpoints/e2e-reviews:predict")

    wait_endpoint_ready(page)
    expect(page.get_by_test_id("placement")).to_have_count(1)

    page.get_by_test_id("try-input").fill("这家店的服务很好，下次还来")
    page.get_by_test_id("try-form").locator("button[type=submit]").click()
    output = page.get_by_test_id("try-output")
    expect(output).to_have_attribute("data-status", "200")
    expect(output).to_contain_text('"label"')
    expect(output).to_contain_text('"top_k"')
    # The call is counted on the charts (the page polls the metrics every 5 s).
    expect(page.locator("[data-k=requests]")).to_have_text("1", timeout=20_000)
    expect(page.locator("#qps-chart polyline")).to_have_count(1)
    shot(page, "deployment-endpoint")

    # A key for an application, shown once; the application calls from outside the browser.
    keys = page.get_by_test_id("key-form")
    keys.locator("#id_name").fill("客服系统")
    keys.locator("button[type=submit]").click()
    key = page.get_by_test_id("new-key").text_content()
    url = page.get_by_test_id("endpoint-url").text_content().removeprefix("POST ").strip()
    r = requests.post(
        url,
        json={"inputs": ["质量糟糕，退货"]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["outputs"][0]["label"] in ("正面", "负面")
    r = requests.post(
        url, json={"inputs": ["好"]}, headers={"Authorization": "Bearer mpe_nope"}, timeout=30
    )
    assert r.status_code == 401
    expect(page.locator("[data-k=requests]")).to_have_text("3", timeout=20_000)
    expect(page.locator("[data-k=unauthorized]")).to_have_text("1")
