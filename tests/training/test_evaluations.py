"""Large models scored on an evaluation set (issue #22), through the real train worker and
runner: two chat models' versions evaluated on a set of multiple-choice and open questions,
each job's figures and per-subject accuracy kept, both ranked on the set's leaderboard
(console, API, CSV), and what an evaluation refuses."""

import csv
import io

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from labeling.datasets import dataset_create
from tests.helpers.data import make_version
from tests.helpers.jobs import wait_for
from training.evaluations import evaluation_submit
from training.jobs import training_job_submit
from training.models import ModelEvaluation

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("train_worker")]

QUESTIONS = [
    ["question", "A", "B", "C", "D", "answer", "references", "subject"],
    ["3加4等于几？", "7", "8", "6", "5", "A", "", "加法"],
    ["5加6等于几？", "10", "11", "12", "9", "B", "", "加法"],
    ["2加2等于几？", "3", "5", "4", "6", "C", "", "算术"],
    ["9加9等于几？", "16", "17", "19", "18", "D", "", "算术"],
    ["1加2等于几？", "", "", "", "", "", '["1加2等于3。"]', "问答"],
]


def test_two_versions_are_evaluated_and_ranked_on_the_sets_leaderboard(
    client, team, owner, model_version
):
    exam = make_version(
        dataset_create(actor=owner, team=team, name="算术考试", task_kind="evaluation"),
        owner,
        QUESTIONS,
    )
    sft = model_version("instruction", name="sft")
    dpo = model_version("preference", name="dpo")
    jobs = [
        evaluation_submit(
            actor=owner, team=team, model_version=v, dataset_version=exam, max_new_tokens=8
        )
        for v in (sft, dpo)
    ]
    for job in jobs:
        job = wait_for(job)
        assert job.status == "succeeded", job.error
        assert job.step == job.total_steps > 0  # progress as the questions were scored
    results = {e.model_version_id: e for e in ModelEvaluation.objects.all()}
    assert set(results) == {sft.pk, dpo.pk}
    for e in results.values():
        metrics = e.metrics
        assert metrics["rows"] == 5 and metrics["choice_rows"] == 4 and metrics["open_rows"] == 1
        assert 0 <= metrics["accuracy_loglik"] <= 1 and 0 <= metrics["rouge_l"] <= 1
        assert set(e.subjects) == {"加法", "算术", "问答"}
        assert e.subjects["加法"]["choice_rows"] == 2
        wrong = [m for m in e.mistakes if m["type"] == "choice"]
        assert len(wrong) == round(4 * (1 - metrics["accuracy_loglik"]))

    client.force_login(owner)
    page = client.get(
        reverse("training:leaderboard", kwargs={"team": team.slug, "dataset_version_id": exam.pk})
    ).content.decode()
    api = client.get(
        reverse(
            "training:api_leaderboard", kwargs={"team": team.slug, "dataset_version_id": exam.pk}
        )
    ).json()
    assert api["ranked_by"] == "accuracy_loglik"
    order = [results[r["evaluation"]["model_version"]] for r in api["rows"]]
    accuracies = [e.metrics["accuracy_loglik"] for e in order]
    assert len(order) == 2 and accuracies == sorted(accuracies, reverse=True)  # best first
    positions = [page.index(f'data-version="{e.model_version_id}"') for e in order]
    assert positions == sorted(positions)  # the page ranks them alike
    exported = client.get(
        reverse("training:leaderboard", kwargs={"team": team.slug, "dataset_version_id": exam.pk})
        + "?format=csv"
    )
    table = list(csv.reader(io.StringIO(b"".join(exported).decode("utf-8-sig"))))
    assert table[0][:4] == ["rank", "model_version", "endpoint", "evaluated_at"]
    assert "accuracy_loglik" in table[0] and "加法" in table[0]
    assert [row[1] for row in table[1:]] == [str(e.model_version) for e in order]

    model_page = client.get(
        reverse("training:model", kwargs={"team": team.slug, "model_version_id": sft.pk})
    ).content.decode()
    assert 'data-testid="evaluations"' in model_page and str(exam) in model_page
    detail = client.get(
        reverse(
            "training:model_evaluation",
            kwargs={"team": team.slug, "evaluation_id": results[sft.pk].pk},
        )
    ).content.decode()
    assert 'data-metric="accuracy_loglik"' in detail and "加法" in detail

    # Through the API: the version's evaluations, and one more queued.
    url = reverse(
        "training:api_model_evaluations", kwargs={"team": team.slug, "model_version_id": sft.pk}
    )
    assert [e["evaluation_set"] for e in client.get(url).json()["results"]] == [str(exam)]
    r = client.post(
        url, {"evaluation_set": exam.pk, "max_new_tokens": 2}, content_type="application/json"
    )
    assert r.status_code == 201 and r.json()["objective"] == "evaluate"


def test_what_an_evaluation_refuses(team, owner, model_version):
    exam = make_version(
        dataset_create(actor=owner, team=team, name="考试", task_kind="evaluation"),
        owner,
        QUESTIONS[:2],
    )
    classifier = model_version("text_classification")
    with pytest.raises(ValidationError, match="not a large model"):
        evaluation_submit(actor=owner, team=team, model_version=classifier, dataset_version=exam)
    chat = model_version("instruction", name="chat")
    reviews = make_version(
        dataset_create(
            actor=owner,
            team=team,
            name="评论",
            task_kind="text_classification",
            labels=["正面", "负面"],
        ),
        owner,
    )
    with pytest.raises(ValidationError, match="not an evaluation set"):
        evaluation_submit(actor=owner, team=team, model_version=chat, dataset_version=reviews)
    with pytest.raises(ValidationError, match="New tokens"):
        evaluation_submit(
            actor=owner, team=team, model_version=chat, dataset_version=exam, max_new_tokens=0
        )
    with pytest.raises(ValidationError, match="not trained on"):
        training_job_submit(actor=owner, team=team, dataset_version=exam)
