"""The quality gate in the browser: choosing a canary's model version shows it beside the
serving one (the compare API, before anything is added), with the warning for a worse one; a
worse canary is added only once confirmed."""

import pytest
from playwright.sync_api import Page, expect

from deployment.models import Revision
from deployment.rollout import endpoint_deploy
from tests.deployment.test_quality import report
from tests.helpers.browser import login
from training.models import ModelVersion

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _version(team, owner, macro_f1: float) -> ModelVersion:
    number = ModelVersion.objects.filter(team=team).count() + 1
    return ModelVersion.objects.create(
        team=team,
        name="reviews",
        number=number,
        task_kind="text_classification",
        labels=["正面", "负面"],
        backend="paddle",
        runtime="paddle_inference",
        evaluation=report(macro_f1),
        storage_prefix=f"models/q{number}/",
        files={"export/manifest.json": {"sha256": "0" * 64, "size": 1}},
        created_by=owner,
    )


def test_the_canary_form_previews_the_comparison(page: Page, owner, team):
    endpoint = endpoint_deploy(
        actor=owner, team=team, model_version=_version(team, owner, 0.85), name="reviews"
    )
    worse, better = _version(team, owner, 0.70), _version(team, owner, 0.90)
    login(page, "olivia", "pw-Secret-123")
    page.goto(f"/t/{team.slug}/endpoints/{endpoint.pk}/")
    form = page.get_by_test_id("canary-form")
    preview = page.get_by_test_id("canary-preview")

    form.locator("#id_model_version").select_option(str(better.pk))
    expect(preview.locator("table")).to_contain_text("+0.0500")
    expect(preview).to_have_attribute("data-worse", "false")
    expect(page.get_by_test_id("preview-worse")).to_have_count(0)

    form.locator("#id_model_version").select_option(str(worse.pk))
    expect(preview).to_have_attribute("data-worse", "true")
    expect(page.get_by_test_id("preview-worse")).to_be_visible()
    expect(preview.locator("table")).to_contain_text("-0.1500")

    form.locator("button[type=submit]").click()
    expect(page.get_by_test_id("worse-warning")).to_be_visible()
    assert not Revision.objects.filter(model_version=worse).exists()
    page.get_by_test_id("confirm-worse").click()
    expect(page.get_by_test_id("revisions").locator('tr[data-revision="2"]')).to_be_visible()
    expect(page.get_by_test_id("comparison")).to_have_attribute("data-worse", "true")
