"""The choosers' search (console.pickers) shows nothing of another team: not by name, not by
an id given as the chosen value, not through another page that has a chooser."""

import re

from django.urls import reverse

from console.roles import Role
from labeling.datasets import dataset_create
from tests.helpers.data import make_version
from tests.helpers.models import stored_model


def _labels(html: str) -> list[str]:
    return re.findall(r'<option value="[^"]*"[^>]*>([^<]*)</option>', html)


def test_a_chooser_never_offers_another_teams_objects(
    client, owner, team, make_team, make_user, tmp_path
):
    rival = make_user("rival")
    other = make_team("Beta", {rival: Role.OWNER})
    theirs = make_version(
        dataset_create(actor=rival, team=other, name="机密数据", task_kind="text_classification"),
        rival,
    )
    their_model = stored_model(other, rival, tmp_path, name="机密模型")
    mine = make_version(
        dataset_create(actor=owner, team=team, name="评论", task_kind="text_classification"), owner
    )
    stored_model(team, owner, tmp_path / "mine", name="评论模型", dataset_version=mine)
    client.force_login(owner)
    job_new = reverse("training:job_new", kwargs={"team": team.slug})
    deploy = reverse("deployment:endpoint_new", kwargs={"team": team.slug})
    asks = [
        (job_new, {"pick": "dataset_version", "dataset_version__q": "机密"}),
        (job_new, {"pick": "dataset_version", "dataset_version": theirs.pk}),
        (deploy, {"pick": "model_version", "model_version__q": "机密"}),
        (deploy, {"pick": "model_version", "model_version": their_model.pk}),
    ]
    for url, params in asks:
        answer = client.get(url, params)
        assert answer.status_code == 200
        assert not any("机密" in label for label in _labels(answer.content.decode())), params
    # Their pages' choosers are theirs: another team's URL is 404 for the search too.
    theirs_url = reverse("training:job_new", kwargs={"team": other.slug})
    assert client.get(theirs_url, {"pick": "dataset_version"}).status_code == 404
    # The page itself, with their version asked for as the chosen one, offers only mine.
    page = client.get(job_new, {"version": theirs.pk}).content.decode()
    assert "机密" not in page and "评论 v1" in page
