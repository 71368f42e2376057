"""An ML engineer submits a training job from the console, watches its loss and metric curves
move while the real train worker runs it, and opens the model version's evaluation report;
then deploys it many ways: compresses it to INT8, distills it into a fast student, compares
the three on one page, sends the INT8 one to the endpoint as a canary, and downloads its edge
bundle, which runs where the platform is not."""

import subprocess
import tarfile

import pytest
from django.conf import settings
from playwright.sync_api import Page, expect

from console.roles import Role
from labeling.datasets import dataset_create
from tests.helpers.browser import login, open_report, shot, submit_job, wait_endpoint_ready
from tests.helpers.data import make_jsonl_version, rows_for
from training.jobs import recommended_values

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def points(page: Page, chart: str) -> int:
    return page.get_by_test_id(chart).evaluate(
        "svg => Math.max(0, ...[...svg.querySelectorAll('polyline')].map(p => +p.dataset.points))"
    )


def test_submit_a_job_watch_the_curves_open_the_report_and_deploy_it_many_ways(
    page: Page, make_user, make_team, train_worker, fresh_host, tmp_path
):
    engineer = make_user("wang", password="Wang-Pass-2026")
    team = make_team("NLP", {engineer: Role.MAINTAINER})
    dataset = dataset_create(
        actor=engineer, team=team, name="评论", task_kind="text_classification"
    )
    rows, mapping = rows_for("text_classification", 240)
    version = make_jsonl_version(dataset, engineer, rows, mapping)

    login(page, "wang", "Wang-Pass-2026")
    # The form guides as it is filled in: the chosen model's recommended values as
    # placeholders, a wrong value refused beside its field, nothing typed lost meanwhile.
    page.goto(f"/t/{team.slug}/training/new/?version={version.pk}")
    form = page.get_by_test_id("job-form")
    transformer = recommended_values("text_classification", "ernie-micro-char")
    form.locator("#id_model").select_option("preset:ernie-micro-char")
    expect(form.locator("#id_learning_rate")).to_have_attribute(
        "placeholder", f"{transformer['learning_rate']:g}"
    )
    expect(page.get_by_test_id("job-plan")).to_contain_text("ernie-micro-char")
    expect(form.locator('[data-field="threshold"]')).to_be_hidden()
    form.locator("#id_batch_size").fill("0")
    form.locator("#id_seed").fill("7")
    form.locator("#id_seed").press("Tab")
    expect(form.locator('[data-field="batch_size"] .errorlist')).to_be_visible()
    expect(form.locator("#id_seed")).to_have_value("7")
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
    # The loss, pale, under its moving average; the slider at 0 shows the raw loss alone.
    chart = page.get_by_test_id("loss-chart")
    expect(chart.locator("polyline[data-name=smoothed]")).to_have_count(1)
    expect(chart.locator("polyline[data-name=raw]")).to_have_attribute("stroke-opacity", "0.3")
    page.get_by_test_id("loss-smoothing").fill("0")
    expect(chart.locator("polyline")).to_have_count(1)
    page.get_by_test_id("loss-smoothing").fill("0.6")
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
    int8_page = page.url

    # Distilled into a fast student from the parent's page.
    page.get_by_test_id("parent").get_by_role("link").click()
    parent_page = page.url
    form = page.get_by_test_id("compress-form")
    form.locator("select[name=method]").select_option("distill")
    form.locator("select[name=student]").select_option("ngram-bag-char")
    page.get_by_test_id("compress").click()
    expect(status).to_have_attribute("data-status", "succeeded", timeout=180_000)
    page.get_by_test_id("model-link").get_by_role("link").click()
    expect(page.get_by_test_id("compression-runs")).to_contain_text("学生模型")

    # The three on one page: metrics, per-label F1, size and speed, how each was made.
    page.goto(parent_page)
    page.get_by_test_id("compare-family").click()
    comparison = page.get_by_test_id("comparison")
    expect(comparison.locator("thead th")).to_have_count(4)
    expect(page.get_by_test_id("compare-made-from").nth(1)).to_contain_text("int8")
    expect(page.get_by_test_id("compare-made-from").nth(2)).to_contain_text("distill")
    for cell in page.get_by_test_id("compare-b32").all():
        expect(cell).not_to_have_text("–")
    expect(comparison.locator('tr[data-label="负面"]')).to_be_visible()
    shot(page, "training-compare-family")

    # The training, compression and distillation jobs' curves on one chart, ticked in the list.
    page.goto(f"/t/{team.slug}/training/")
    for box in page.locator('[data-testid="jobs"] input[name="ids"]').all():
        box.check()
    page.get_by_test_id("compare-jobs").click()
    expect(page.get_by_test_id("compared-jobs").locator("tbody tr")).to_have_count(3)
    expect(page.locator("#compare-loss-chart polyline").first).to_be_attached()
    expect(page.locator("#compare-metric-chart polyline").first).to_be_attached()
    shot(page, "training-compare-curves")

    # The parent deployed, the INT8 version beside it as a 10 % canary.
    page.goto(parent_page)
    page.get_by_test_id("deploy").click()
    form = page.get_by_test_id("deploy-form")
    form.locator("#id_name").fill("reviews-many")
    form.locator("button[type=submit]").click()
    wait_endpoint_ready(page)
    canary = page.get_by_test_id("canary-form")
    canary.locator("#id_model_version").select_option(label="评论 v2")
    with page.expect_navigation():
        canary.locator("button[type=submit]").click()
    if page.get_by_test_id("confirm-worse").count():
        page.get_by_test_id("confirm-worse").click()
    revisions = page.get_by_test_id("revisions")
    expect(revisions.locator('tr[data-revision="2"] [data-testid=weight]')).to_have_text("10")
    wait_endpoint_ready(page, timeout=120)
    page.get_by_test_id("try-input").fill("这家店的服务很好，下次还来")
    page.get_by_test_id("try-form").locator("button[type=submit]").click()
    expect(page.get_by_test_id("try-output")).to_have_attribute("data-status", "200")
    shot(page, "training-int8-canary")

    # The INT8 version's edge bundle: the predictor and the model, checked against the
    # report's own outputs by the runtime alone (no platform on the path).
    page.goto(int8_page)
    with page.expect_download() as download:
        page.get_by_test_id("edge-onnx").click()
    bundle = tmp_path / "bundle.tar.gz"
    download.value.save_as(bundle)
    with tarfile.open(bundle) as tf:
        tf.extractall(tmp_path / "edge", filter="data")
    folder = tmp_path / "edge" / "onnx-edge"
    checked = subprocess.run(
        [settings.TRAINING_PYTHON, "-E", "-s", "predict.py", "--check"],
        cwd=folder,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
