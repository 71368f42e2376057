"""Choosers that scale (console.pickers): a page lists a page of the team's objects, the search
box asks the page for those matching what is typed, and what may be chosen stays the form's
queryset (another team's object is neither offered nor accepted)."""

import re

from django.urls import reverse

from console.pickers import PAGE
from console.roles import Role
from labeling.datasets import dataset_create
from labeling.models import DatasetVersion
from tests.helpers.data import make_version
from training.models import BaseModel, TrainingJob


def _options(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', html)


def _versions(dataset, template, n: int) -> None:
    DatasetVersion.objects.bulk_create(
        DatasetVersion(
            dataset=dataset,
            number=number,
            source=template.source,
            created_by=template.created_by,
            content_hash=f"{dataset.pk}-{number}",
            format="csv",
            row_count=3,
            rejected_count=0,
            duplicate_count=0,
            split_counts=template.split_counts,
            stats=template.stats,
            data_file=template.data_file,
            report_file=template.report_file,
        )
        for number in range(2, n + 1)
    )


def test_the_version_chooser_lists_a_page_and_searches_the_rest(client, owner, team, make_team):
    dataset = dataset_create(actor=owner, team=team, name="评论", task_kind="text_classification")
    _versions(dataset, make_version(dataset, owner), PAGE + 30)
    other = make_team("Beta", {owner: Role.OWNER})
    theirs = make_version(
        dataset_create(actor=owner, team=other, name="机密", task_kind="text_classification"),
        owner,
    )
    client.force_login(owner)
    url = reverse("training:job_new", kwargs={"team": team.slug})

    page = client.get(url).content.decode()
    chooser = page.split('name="dataset_version"')[1].split("</select>")[0]
    # A page (the browser takes the first, the newest), then a line that says there is more.
    assert len(_options(chooser)) == PAGE and '<option disabled value="">' in chooser
    # Typed: the matching versions, from the whole list, as options for the select.
    found = client.get(url, {"pick": "dataset_version", "dataset_version__q": "评论 v77"})
    assert [label for _v, label in _options(found.content.decode())] == ["评论 v77"]
    assert (
        _options(
            client.get(
                url, {"pick": "dataset_version", "dataset_version__q": "机密"}
            ).content.decode()
        )
        == []
    )
    # The chosen one stays first whatever the search.
    v3 = DatasetVersion.objects.get(dataset=dataset, number=3)
    kept = client.get(
        url, {"pick": "dataset_version", "dataset_version": v3.pk, "dataset_version__q": "v8"}
    )
    assert _options(kept.content.decode())[0] == (str(v3.pk), "评论 v3")
    # Another team's version, posted by id, is refused as any unknown choice.
    posted = client.post(
        url,
        {
            "dataset_version": theirs.pk,
            "backend": "paddle",
            "model": "preset:",
            "device_type": "cpu",
            "device_count": 1,
            "priority": 5,
        },
    )
    assert posted.status_code == 200 and not TrainingJob.objects.exists()
    assert "选择一个有效的选项" in posted.content.decode()  # Django's "Select a valid choice"


def test_the_model_chooser_finds_base_models_by_name_and_keeps_the_presets(
    client, owner, team, make_team
):
    BaseModel.objects.bulk_create(
        BaseModel(
            team=team,
            name=f"ernie-{i:03d}",
            backend="paddle",
            architecture="ernie",
            storage_prefix=f"b/{i}/",
            summary={"layers": 2},
        )
        for i in range(PAGE + 20)
    )
    BaseModel.objects.create(
        team=None,
        name="shared-qwen",
        backend="paddle",
        architecture="qwen2",
        storage_prefix="s/",
        summary={"causal_lm": True},
    )
    other = make_team("Beta", {owner: Role.OWNER})
    BaseModel.objects.create(
        team=other, name="their-secret", backend="paddle", architecture="ernie", storage_prefix="t/"
    )
    client.force_login(owner)
    url = reverse("training:job_new", kwargs={"team": team.slug})
    page = client.get(url).content.decode()
    chooser = page.split('name="model"')[1].split("</select>")[0]
    values = [v for v, _label in _options(chooser)]
    assert "preset:" in values and "preset:ngram-bag-char" in values  # every preset, always
    assert sum(v.startswith("base:") for v in values) == PAGE + 1  # the chosen one and a page
    # The team's own encoder is chosen for a new job (fine-tuning beats training from scratch).
    assert re.search(r'<option value="base:ernie-000" selected>', chooser)

    def search(q: str, path: str = url) -> list[str]:
        got = client.get(path, {"pick": "model", "model__q": q}).content.decode()
        return [v for v, _label in _options(got)]

    assert search("ernie-065") == ["base:ernie-065"]
    assert search("shared-qwen") == ["base:shared-qwen"]  # shared with every team
    assert search("ngram") == ["preset:ngram-bag-char"]  # presets filtered as typed too
    assert search("their-secret") == []
    # The sweep form offers no causal language model.
    sweep = reverse("training:sweep_new", kwargs={"team": team.slug})
    assert search("shared-qwen", sweep) == [] and search("ernie-065", sweep) == ["base:ernie-065"]
