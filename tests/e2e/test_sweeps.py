"""An ML engineer starts a hyperparameter search from the console: ticks the learning rate and
the epochs, gives their ranges, and watches the sweep page list every trial as the real train
worker runs them, until it marks the best trial, links its model and shows how much each
hyperparameter mattered."""

import pytest
from playwright.sync_api import Page, expect

from console.roles import Role
from labeling.datasets import dataset_create
from tests.helpers.browser import login, shot
from tests.helpers.data import make_jsonl_version, rows_for
from training.models import ModelVersion, Sweep

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_start_a_sweep_and_find_its_best_trial(page: Page, make_user, make_team, train_worker):
    engineer = make_user("wang", password="Wang-Pass-2026")
    team = make_team("NLP", {engineer: Role.MAINTAINER})
    dataset = dataset_create(
        actor=engineer, team=team, name="评论", task_kind="text_classification"
    )
    rows, mapping = rows_for("text_classification", 120)
    version = make_jsonl_version(dataset, engineer, rows, mapping)

    login(page, "wang", "Wang-Pass-2026")
    page.goto(f"/t/{team.slug}/training/")
    page.get_by_test_id("sweeps-link").click()
    page.get_by_test_id("new-sweep").click()
    form = page.get_by_test_id("sweep-form")
    form.locator("#id_dataset_version").select_option(str(version.pk))
    form.locator("#id_n_trials").fill("3")
    form.locator("#id_parallel").fill("2")
    form.locator("#id_name").fill("学习率搜索")
    form.locator("#id_search_learning_rate").check()
    form.locator("#id_learning_rate_low").fill("0.00001")
    form.locator("#id_learning_rate_high").fill("0.003")
    form.locator("#id_learning_rate_log").check()
    form.locator("#id_search_epochs").check()
    form.locator("#id_epochs_choices").fill("2, 3")
    shot(page, "training-new-sweep")
    page.get_by_test_id("submit-sweep").click()

    # The sweep page: its trials, as they are queued and run (the page reloads itself).
    status = page.get_by_test_id("sweep-status")
    expect(status).to_have_attribute("data-status", "running")
    expect(page.get_by_test_id("trial-0")).to_be_visible()
    expect(page.get_by_test_id("trial-1")).to_be_visible()
    expect(status).to_have_attribute("data-status", "succeeded", timeout=240_000)
    trials = page.get_by_test_id("trials")
    expect(trials.locator("tbody tr")).to_have_count(3)
    expect(trials.locator("tr[data-best]")).to_have_count(1)
    expect(page.get_by_test_id("importance-learning_rate")).to_be_visible()
    expect(page.get_by_test_id("importance-epochs")).to_be_visible()
    shot(page, "training-sweep")

    # Only the best trial's model is registered; its link opens the model's report.
    sweep = Sweep.objects.get(name="学习率搜索")
    assert list(ModelVersion.objects.filter(team=team)) == [sweep.best_model_version]
    page.get_by_test_id("best-model").get_by_role("link").click()
    expect(page.get_by_test_id("metrics")).to_contain_text("accuracy")
