"""The model page says how many evaluated rows were longer than the maximum length (#20)."""

from django.urls import reverse

from tests.helpers.models import stored_model

EVALUATION = {
    "split": "test",
    "rows": 24,
    "metrics": {"accuracy": 0.9, "macro_f1": 0.9, "support": 24},
    "long_rows": 7,
    "max_chars": 30,
}


def _page(client, team, owner, tmp_path, evaluation, **fields) -> str:
    version = stored_model(team, owner, tmp_path, evaluation=evaluation, **fields)
    client.force_login(owner)
    url = reverse("training:model", kwargs={"team": team.slug, "model_version_id": version.pk})
    return client.get(url).content.decode()


def test_the_model_page_counts_the_long_rows(client, team, owner, tmp_path):
    body = _page(client, team, owner, tmp_path / "a", EVALUATION)
    # The page is in the user's language (English here; the zh-hans msgstr is in django.po).
    assert 'data-testid="long-rows"' in body
    assert (
        "7 of 24 rows of the test set were longer than the maximum length (30 characters): "
        "predicted over overlapping windows"
    ) in body


def test_a_pair_model_says_its_long_rows_were_cut(client, team, owner, tmp_path):
    body = _page(client, team, owner, tmp_path / "a", EVALUATION, task_kind="text_pair")
    assert "the longer text of each pair was cut" in body and "overlapping" not in body


def test_no_line_without_long_rows(client, team, owner, tmp_path):
    body = _page(client, team, owner, tmp_path / "a", {**EVALUATION, "long_rows": 0})
    assert 'data-testid="long-rows"' not in body
