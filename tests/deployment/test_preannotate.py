"""Pre-annotation: a deployed model's answers for a labeling project's unlabeled tasks go into
the real Label Studio as predictions with scores, least confident served first."""

import pytest
from django.core.exceptions import ValidationError

from deployment.hosts import endpoint_chat_complete, endpoint_predict
from deployment.preannotate import DRAFT_MAX_TOKENS, preannotate_run, preannotate_start
from deployment.rollout import endpoint_deploy
from labeling import label_studio
from labeling.datasets import dataset_create
from labeling.models import Annotation
from labeling.projects import labeling_project_create
from tests.helpers.data import make_version, reviews_dataset
from tests.helpers.label_studio import needs_label_studio, push_project
from tests.helpers.serving import converge

pytestmark = needs_label_studio

ROWS = [
    ["text", "label"],
    ["这个产品很好，推荐", "正面"],
    ["服务很差，失望", ""],
    ["总体来说满意", ""],
    ["讨厌，退货", ""],
]


def test_unlabeled_tasks_get_the_endpoints_predictions(
    db, fresh_host, owner, team, model_version, make_team, make_user
):
    dataset = reviews_dataset(team, owner, "评论")
    version = make_version(dataset, owner, ROWS)
    project = push_project(owner, version, "第二轮")
    # Row 3 was labeled meanwhile: it keeps its annotation and gets no prediction.
    task3 = project.tasks.get(row=3)
    Annotation.objects.create(
        project=project, task=task3, ls_annotation_id=1, value={"label": "正面"}
    )

    endpoint = endpoint_deploy(actor=owner, team=team, model_version=model_version())
    converge(fresh_host, endpoint)
    preannotate_start(actor=owner, project=project, endpoint=endpoint)
    assert preannotate_run(project.pk, endpoint.pk, batch_size=2) == 3

    answers = {}
    for task in label_studio.client(project.team).tasks.list(
        project=project.ls_project_id, fields="all"
    ):
        for p in task.predictions:
            data = p.model_dump() if hasattr(p, "model_dump") else p
            if data["model_version"].startswith("reviews:"):
                label = data["result"][0]["value"]["choices"][0]
                answers[task.data["platform_row"]] = (label, data["score"])
    assert set(answers) == {1, 2, 4}
    expected = endpoint_predict(endpoint=endpoint, inputs=[ROWS[1][0], ROWS[2][0], ROWS[4][0]])[1][
        "outputs"
    ]
    for row, out in zip((1, 2, 4), expected, strict=True):
        assert answers[row][0] == out["label"]
        assert answers[row][1] == pytest.approx(out["score"], abs=1e-3)
    stored = label_studio.client(project.team).projects.get(id=project.ls_project_id)
    assert stored.sampling == "Uncertainty sampling"

    # Another team's endpoint, or one of another task kind, is refused.
    other = make_team("Beta", {make_user("bob"): "owner"})
    theirs = endpoint_deploy(
        actor=owner, team=team, model_version=model_version("ner", name="places")
    )
    with pytest.raises(ValidationError, match="serves ner models"):
        preannotate_start(actor=owner, project=project, endpoint=theirs)
    theirs.team = other
    with pytest.raises(ValidationError, match="another team"):
        preannotate_start(actor=owner, project=project, endpoint=theirs)


def test_a_chat_model_drafts_the_responses_annotators_correct(
    db, fresh_host, owner, team, model_version
):
    """Instruction rows that await a response get the deployed chat model's draft as a
    prediction in Label Studio; the annotator's correction is what the export keeps."""
    from tests.helpers.data import make_jsonl_version

    dataset = dataset_create(actor=owner, team=team, name="问答", task_kind="instruction")
    rows = [
        {"messages": [{"role": "user", "content": "3加4等于几？"}]},
        {"messages": [{"role": "user", "content": "5加2等于几？"}]},
        {
            "messages": [
                {"role": "user", "content": "1加1等于几？"},
                {"role": "assistant", "content": "1加1等于2。"},
            ]
        },
    ]
    version = make_jsonl_version(dataset, owner, rows, {"messages": "messages"})
    project = push_project(owner, version, "写回答", selection="unlabeled")
    assert project.tasks.count() == 2

    endpoint = endpoint_deploy(
        actor=owner, team=team, model_version=model_version("instruction", name="helper")
    )
    converge(fresh_host, endpoint)
    preannotate_start(actor=owner, project=project, endpoint=endpoint)
    assert preannotate_run(project.pk, endpoint.pk) == 2
    drafts = {}
    for task in label_studio.client(project.team).tasks.list(
        project=project.ls_project_id, fields="all"
    ):
        for p in task.predictions:
            data = p.model_dump() if hasattr(p, "model_dump") else p
            drafts[task.data["platform_row"]] = data["result"][0]["value"]["text"][0]
    expected = endpoint_chat_complete(
        endpoint=endpoint,
        messages=[{"role": "user", "content": "3加4等于几？"}],
        max_tokens=DRAFT_MAX_TOKENS,
    )
    assert drafts[1] == expected and "等于" in drafts[1]

    pairs = dataset_create(actor=owner, team=team, name="偏好", task_kind="preference")
    pair_version = make_jsonl_version(
        pairs,
        owner,
        [{"prompt": "问", "response_a": "甲", "response_b": "乙"}],
        {"prompt": "prompt", "response_a": "response_a", "response_b": "response_b"},
    )
    pair_project = labeling_project_create(actor=owner, version=pair_version, name="比较")
    pair_project.ls_project_id = 1
    with pytest.raises(ValidationError, match="serves instruction models"):
        preannotate_start(actor=owner, project=pair_project, endpoint=endpoint)
