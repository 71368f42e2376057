"""An ML engineer submits a training job from the console, watches its loss and metric curves
move while the real train worker runs it, and opens the model version's evaluation report."""

import pytest
from playwright.sync_api import Page, expect

from console.roles import Role
from labeling.datasets import dataset_create
from tests.helpers.browser import login, open_report, shot, submit_job
from tests.helpers.data import make_jsonl_version, rows_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def points(page: Page, chart: str) -> int:
    return page.get_by_test_id(chart).evaluate(
        "svg => Math.max(0, ...[...svg.querySelectorAll('polyline')].map(p => +p.dataset.points))"
    )


def test_submit_a_job_watch_the_curves_and_open_the_report(
    page: Page, make_user, make_team, train_worker
):
    engineer = make_user("wang", password="Wang-Pass-2026")
    team = make_team("NLP", {engineer: Role.MAINTAINER})
    dataset = dataset_create(
        actor=engineer, team=team, name="评论", task_kind="text_classification"
    )
    rows, mapping = rows_for("text_classification", 240)
    version = make_jsonl_version(dataset, engineer, rows, mapping)

    login(page, "wang", "Wang-Pass-2026")
    page.goto(f"/t/{team.slug}/training/")
    submit_job(
        page,
        version,
        model="preset:ernie-micro-char",
        shot_as="training-new-job",
        epochs=25,
        batch_size=8,
        early_stopping_patience=0,  # long enough to watch it run
    )

    # The job page follows the run without a reload: the curves grow, the bar moves.
    status = page.get_by_test_id("job-status")
    expect(status).to_have_attribute("data-status", "running", timeout=60_000)
    page.wait_for_function(
        "document.querySelector('#loss-chart polyline')?.dataset.points >= 2", timeout=60_000
    )
    first = points(page, "loss-chart")
    page.wait_for_function(
        f"document.querySelector('#loss-chart polyline').dataset.points > {first}",
        timeout=60_000,
    )
    page.wait_for_function(
        "document.querySelector('#metric-chart polyline')?.dataset.points >= 2", timeout=60_000
    )
    expect(page.get_by_test_id("progress-bar")).not_to_have_attribute("style", "width: 0%")
    shot(page, "training-job-running")

    # Done: the page reloads once and links the model version.
    expect(status).to_have_attribute("data-status", "succeeded", timeout=120_000)
    open_report(page, ("正面", "负面"), "评论 v1")
    # Beside the model, the baselines trained and scored on the same split (runtime.baselines).
    expect(page.get_by_test_id("baseline-summary")).to_contain_text("tfidf_char_lr")
    expect(page.get_by_test_id("baseline-per-label")).to_contain_text("负面")
    shot(page, "training-report")

    # Its export targets: the Paddle export and its ONNX form, which decided as it did.
    targets = page.get_by_test_id("targets")
    expect(targets.locator('tr[data-target="paddle_inference"]')).to_have_attribute(
        "data-status", "ready"
    )
    expect(targets.locator('tr[data-target="onnx"]')).to_have_attribute("data-status", "ready")
    expect(targets.locator('tr[data-target="onnx"]')).to_contain_text("1.0000")
    expect(page.get_by_test_id("edge-onnx")).to_be_visible()

    # Compressed to INT8 from the report: a job, then a new version beside its parent.
    form = page.get_by_test_id("compress-form")
    form.locator("select[name=mode]").select_option("dynamic")
    shot(page, "training-compress")
    page.get_by_test_id("compress").click()
    expect(status).to_have_attribute("data-status", "succeeded", timeout=120_000)
    page.get_by_test_id("model-link").get_by_role("link").click()
    expect(page.get_by_test_id("parent")).to_contain_text("评论 v1")
    expect(page.get_by_test_id("compression-runs")).to_contain_text("INT8")
    expect(
        page.get_by_test_id("compression-metrics").locator('tr[data-metric="accuracy"]')
    ).to_be_visible()
    shot(page, "training-compressed")
