"""Labeling projects against the real Label Studio: creation per task kind, the push of tasks
with existing labels as predictions, row selections, and the guard on deleting a dataset."""

import pytest
from django.core.exceptions import ValidationError

from labeling import label_studio
from labeling.datasets import dataset_create, dataset_delete
from labeling.imports import import_run
from labeling.models import LabelingProject
from labeling.projects import (
    labeling_project_create,
    labeling_project_preannotate,
    labeling_project_push,
    labeling_project_set_labels,
)
from labeling.sync import labeling_project_sync
from tests.helpers.data import make_jsonl_version, make_version, reviews_dataset
from tests.helpers.label_studio import annotate, choice, needs_label_studio, push_project

pytestmark = needs_label_studio


@pytest.fixture
def dataset(owner, team):
    """Reviews to label, 正面 or 负面."""
    return reviews_dataset(team, owner, "评论")


def ls_tasks(project: LabelingProject) -> list:
    ls = label_studio.client(project.team)
    return list(ls.tasks.list(project=project.ls_project_id, fields="all"))


def first_prediction(task) -> dict:
    """The first result of a task's first prediction, as plain JSON."""
    prediction = task.predictions[0]
    data = prediction.model_dump() if hasattr(prediction, "model_dump") else prediction
    return data["result"][0]


def push(owner, version, **options) -> LabelingProject:
    return push_project(owner, version, "第一轮标注", **options)


def test_push_makes_the_project_and_its_tasks_with_labels_as_predictions(owner, dataset):
    rows = [["text", "label"], ["房间干净", "正面"], ["早餐很差", ""], ["服务热情", "正面"]]
    version = make_version(dataset, owner, rows)
    project = push(owner, version, instructions="按情感倾向选择", overlap=2)
    assert project.status == "ready" and project.tasks_total == project.tasks_pushed == 3
    stored = label_studio.client(project.team).projects.get(id=project.ls_project_id)
    assert stored.maximum_annotations == 2 and "正面" in stored.label_config
    assert stored.title.startswith(f"{dataset.team.slug} · 第一轮标注")
    tasks = {t.data["platform_row"]: t for t in ls_tasks(project)}
    assert {r: t.data["text"] for r, t in tasks.items()} == {
        1: "房间干净",
        2: "早餐很差",
        3: "服务热情",
    }
    assert first_prediction(tasks[1])["value"]["choices"] == ["正面"]
    assert tasks[2].predictions == []
    assert set(project.tasks.values_list("ls_task_id", flat=True)) == {t.id for t in tasks.values()}


def test_a_second_push_adds_nothing(owner, dataset):
    project = push(owner, make_version(dataset, owner))
    again = labeling_project_push(project.pk)
    assert again.tasks_pushed == 3 and len(ls_tasks(project)) == 3


def test_row_selections(owner, dataset):
    rows = [["text", "label"]] + [[f"评论{i}", "正面" if i % 2 else ""] for i in range(40)]
    version = make_version(dataset, owner, rows)
    assert push(owner, version, selection="unlabeled").tasks_total == 20
    assert push(owner, version, selection="sample", sample_size=7).tasks_total == 7
    test_rows = version.split_counts["test"]
    assert push(owner, version, selection="split", split="test").tasks_total == test_rows


@pytest.mark.parametrize(
    ("kind", "header", "row", "result_type"),
    [
        ("multi_label", ["text", "labels"], ["降息利好", "财经|政策"], "choices"),
        ("text_pair", ["text_a", "text_b", "label"], ["怎么办卡", "办卡流程", "相似"], "choices"),
    ],
)
def test_other_kinds_push(owner, team, kind, header, row, result_type):
    dataset = dataset_create(actor=owner, team=team, name=kind, task_kind=kind)
    version = make_version(dataset, owner, [header, row])
    project = push(owner, version, labels=["财经", "政策", "相似", "不相似"])
    (task,) = ls_tasks(project)
    assert first_prediction(task)["type"] == result_type


def test_ner_spans_become_predictions(owner, team):
    dataset = dataset_create(actor=owner, team=team, name="实体", task_kind="ner")
    line = {"text": "张三在北京工作", "entities": [{"start": 0, "end": 2, "label": "PER"}]}
    version = make_jsonl_version(dataset, owner, [line], {"text": "text", "entities": "entities"})
    project = push(owner, version, labels=["PER", "LOC"])
    (task,) = ls_tasks(project)
    value = first_prediction(task)["value"]
    assert (value["start"], value["end"], value["text"], value["labels"]) == (0, 2, "张三", ["PER"])


def test_a_dataset_being_labeled_cannot_be_deleted(owner, dataset):
    version = make_version(dataset, owner)
    labeling_project_create(actor=owner, version=version, name="进行中")
    with pytest.raises(ValidationError, match="in use"):
        dataset_delete(actor=owner, dataset=dataset)
    assert dataset.versions.count() == 1


def test_project_settings_are_checked(owner, dataset):
    version = make_version(dataset, owner)
    with pytest.raises(ValidationError, match="sample needs its size"):
        labeling_project_create(actor=owner, version=version, name="x", selection="sample")
    with pytest.raises(ValidationError, match="annotators per task"):
        labeling_project_create(actor=owner, version=version, name="x", overlap=0)


def test_console_creates_a_project_and_shows_its_progress(client, owner, team, dataset):
    version = make_version(dataset, owner)
    client.force_login(owner)
    base = f"/t/{team.slug}/datasets/{dataset.pk}/v/{version.number}/"
    assert "label/" in client.get(base).content.decode()
    response = client.post(
        base + "label/",
        {"name": "第二轮", "labels": "正面, 负面", "overlap": 2, "selection": "all"},
    )
    project = LabelingProject.objects.get(name="第二轮")
    assert response["Location"] == f"/t/{team.slug}/labeling/{project.pk}/"
    labeling_project_push(project.pk)
    page = client.get(response["Location"]).content.decode()
    assert "已完成 0 / 3 个任务" in page
    assert 'data-testid="open-ls"' in page
    listing = client.get(f"/t/{team.slug}/labeling/").content.decode()
    assert "第二轮" in listing


def test_preannotations_go_to_label_studio_least_confident_first(owner, dataset):
    version = make_version(dataset, owner)
    project = push(owner, version)
    predictions = [
        {"row": 1, "value": {"label": "正面"}, "score": 0.95},
        {"row": 2, "value": {"label": "负面"}, "score": 0.51},
        {"row": 3, "value": {"label": "正面"}, "score": 0.70},
    ]
    assert (
        labeling_project_preannotate(
            project=project, predictions=predictions, model_version="ernie-tiny-v3"
        )
        == 3
    )
    ls = label_studio.client(project.team)
    stored = ls.projects.get(id=project.ls_project_id)
    assert stored.sampling == "Uncertainty sampling"
    scores = {}
    for task in ls_tasks(project):
        for p in task.predictions:
            data = p.model_dump() if hasattr(p, "model_dump") else p
            if data["model_version"] == "ernie-tiny-v3":
                scores[task.data["platform_row"]] = data["score"]
    assert scores == {1: 0.95, 2: 0.51, 3: 0.70}
    with pytest.raises(ValidationError, match="Unknown label"):
        labeling_project_preannotate(
            project=project,
            predictions=[{"row": 1, "value": {"label": "中性"}, "score": 0.5}],
            model_version="bad",
        )
    with pytest.raises(ValidationError, match="not a task"):
        labeling_project_preannotate(
            project=project,
            predictions=[{"row": 99, "value": {"label": "正面"}, "score": 0.5}],
            model_version="bad",
        )


def test_labeling_projects_through_the_api(owner, team, dataset):
    from rest_framework.test import APIClient

    version = make_version(dataset, owner)
    api = APIClient()
    api.force_authenticate(owner)
    base = f"/api/v1/teams/{team.slug}/labeling-projects/"
    created = api.post(
        base,
        {"dataset": dataset.pk, "version": version.number, "name": "接口", "overlap": 2},
        format="json",
    )
    assert created.status_code == 201 and created.json()["status"] == "creating"
    project_id = created.json()["id"]
    labeling_project_push(project_id)
    detail = api.get(f"{base}{project_id}/").json()
    assert detail["status"] == "ready" and detail["progress"]["total"] == 3
    labels = {"labels": ["正面", "负面", "中立"]}
    relabeled = api.patch(f"{base}{project_id}/", labels, format="json")
    assert relabeled.status_code == 200 and relabeled.json()["labels"] == ["正面", "负面", "中立"]
    ls = label_studio.client(team)
    assert "中立" in ls.projects.get(id=detail["ls_project_id"]).label_config
    project = LabelingProject.objects.get(pk=project_id)
    first = project.tasks.get(row=1).ls_task_id
    annotate(team, owner, first, choice("负面"))
    labeling_project_sync(project_id)
    assert api.get(f"{base}{project_id}/").json()["progress"]["annotations"] == 1
    fixed = api.patch(
        f"{base}{project_id}/", {"labels": ["x"]}, format="json", HTTP_ACCEPT_LANGUAGE="en"
    )
    assert fixed.status_code == 400 and "fixed" in str(fixed.json())
    exported = api.post(f"{base}{project_id}/export/", {"rule": "majority"}, format="json")
    assert exported.status_code == 202
    job = import_run(exported.json()["id"])
    assert job.version.row_count == 3
    bad = api.post(
        f"{base}{project_id}/predictions/",
        {
            "model_version": "m",
            "predictions": [{"row": 1, "value": {"label": "中性"}, "score": 0.3}],
        },
        format="json",
        HTTP_ACCEPT_LANGUAGE="en",
    )
    assert bad.status_code == 400 and "中性" in str(bad.json())


def test_labels_are_editable_until_the_first_annotation(owner, dataset):
    project = push(owner, make_version(dataset, owner))
    labeling_project_set_labels(actor=owner, project=project, labels=["好评", "差评"])
    ls = label_studio.client(project.team)
    assert "好评" in ls.projects.get(id=project.ls_project_id).label_config
    task_id = project.tasks.first().ls_task_id
    ls.annotations.create(
        id=task_id,
        result=[
            {
                "from_name": "label",
                "to_name": "text",
                "type": "choices",
                "value": {"choices": ["好评"]},
            }
        ],
    )
    with pytest.raises(ValidationError, match="fixed once the first annotation"):
        labeling_project_set_labels(actor=owner, project=project, labels=["x"])
    project.refresh_from_db()
    assert project.labels == ["好评", "差评"]


def test_ten_thousand_tasks_are_pushed(owner, dataset):
    rows = [["text", "label"]] + [
        [f"第{i}条评论，服务不错", "正面" if i % 3 else ""] for i in range(10_000)
    ]
    project = push(owner, make_version(dataset, owner, rows))
    assert project.tasks_pushed == project.tasks_total == 10_000
    stored = label_studio.client(project.team).projects.get(id=project.ls_project_id)
    assert stored.task_number == 10_000
    assert project.tasks.values("ls_task_id").distinct().count() == 10_000
