"""A judge of an evaluation's open questions (``deployment.judge``): another deployed chat model
of the team scores each open question through a rubric, on the real serving host; every
judgement is kept with the judge's reply, and the page shows them."""

import json

import pytest
from django.core.exceptions import ValidationError
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.urls import reverse

from deployment.judge import DEFAULT_RUBRIC, _prompt, judge_run, judge_start, judgement
from labeling.datasets import dataset_create
from tests.helpers.data import make_version
from tests.helpers.serving import converge
from training.models import ModelEvaluation

ITEMS = [
    {"row": 1, "type": "choice", "question": "1+1?", "answer": "B", "choice_loglik": "A"},
    {
        "row": 2,
        "type": "open",
        "question": "3加4等于几？",
        "references": ["等于7。"],
        "generated": "等于7。",
    },
    {
        "row": 3,
        "type": "open",
        "question": "请写 {answer}",
        "references": ["好"],
        "generated": "不知道",
    },
]


def test_a_judges_reply_gives_its_score_and_reason_and_a_rubric_is_filled_once():
    assert judgement("分数：4\n理由：答案正确，但不完整。") == (4, "答案正确，但不完整。")
    assert judgement("Score: 5. Reason: right") == (5, "right")
    assert judgement("分数: 9") == (None, "") and judgement("不知道") == (None, "")
    # A row's own text that holds a placeholder is not filled again.
    prompt = _prompt("Q={question} A={answer}", ITEMS[2])
    assert prompt == "Q=请写 {answer} A=不知道"


@pytest.mark.django_db
def test_a_deployed_chat_model_judges_the_open_questions(
    fresh_host, owner, team, model_version, client
):
    from deployment.rollout import endpoint_deploy

    exam = make_version(
        dataset_create(actor=owner, team=team, name="exam", task_kind="evaluation"),
        owner,
        [["question", "references"], ["3加4等于几？", "等于7。"]],
    )
    judged = model_version("instruction", name="student")
    name = default_storage.save(
        "evaluations/test.json", ContentFile(json.dumps(ITEMS, ensure_ascii=False).encode())
    )
    evaluation = ModelEvaluation.objects.create(
        team=team,
        model_version=judged,
        dataset_version=exam,
        metrics={"rows": 3, "choice_rows": 1, "open_rows": 2},
        items_file=name,
    )
    endpoint = endpoint_deploy(
        actor=owner, team=team, model_version=model_version("instruction", name="judge")
    )
    converge(fresh_host, endpoint)

    with pytest.raises(ValidationError, match="holds"):
        judge_start(actor=owner, evaluation=evaluation, endpoint=endpoint, rubric="只给分数")
    judge_start(actor=owner, evaluation=evaluation, endpoint=endpoint, rubric=DEFAULT_RUBRIC)
    with pytest.raises(ValidationError, match="at work"):
        judge_start(actor=owner, evaluation=evaluation, endpoint=endpoint)
    figures = judge_run(evaluation.pk)  # the Celery task's body
    assert figures["status"] == "done" and figures["judged"] == 2
    evaluation.refresh_from_db()
    kept = json.loads(default_storage.open(evaluation.judge["judgements_file"]).read())
    assert [j["row"] for j in kept] == [2, 3]
    assert all(j["reply"] for j in kept)  # the judge's whole reply, scored or not
    scored = [j["score"] for j in kept if j["score"] is not None]
    assert evaluation.judge["unscored"] == 2 - len(scored)
    if scored:
        assert evaluation.metrics["judge_score"] == pytest.approx(sum(scored) / len(scored))

    client.force_login(owner)
    page = client.get(
        reverse("training:model_evaluation", args=[team.slug, evaluation.pk])
    ).content.decode()
    assert 'data-testid="judgements"' in page and 'data-status="done"' in page
    form = client.get(reverse("deployment:evaluation_judge", args=[team.slug, evaluation.pk]))
    assert form.status_code == 200 and "{answer}" in form.content.decode()
