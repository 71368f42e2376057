"""A deployed chat model scored on an evaluation set through its own API
(``deployment.evaluations``), on the real serving host: every question asked as its
applications ask, the answers scored as an evaluate job scores a version's, the result ranked
on the set's leaderboard beside the versions' own, and an endpoint that went away fails the
evaluation with the reason; a run whose worker was killed comes back asking only the
questions after the answers it kept."""

import json
import os
import subprocess
import sys

import pytest
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.urls import reverse
from django.utils import translation

from deployment.evaluations import endpoint_evaluation_run, endpoint_evaluation_start
from deployment.hosts import endpoint_chat_complete
from labeling.datasets import dataset_create
from runtime.llm_eval import choice_prompt
from tests.helpers.data import make_version
from tests.helpers.serving import converge
from tests.helpers.system import ROOT
from tests.helpers.workers import suite_database_url
from training.evaluations import leaderboard
from training.models import ModelEvaluation

QUESTIONS = [
    ["question", "A", "B", "C", "D", "answer", "references", "subject"],
    ["3加4等于几？", "7", "8", "6", "5", "A", "", "加法"],
    ["5加6等于几？", "10", "11", "12", "9", "B", "", "加法"],
    ["1加2等于几？", "", "", "", "", "", '["1加2等于3。"]', "问答"],
]


@pytest.fixture
def exam(team, owner):
    return make_version(
        dataset_create(actor=owner, team=team, name="exam", task_kind="evaluation"),
        owner,
        QUESTIONS,
    )


@pytest.mark.django_db
def test_a_deployed_chat_model_is_scored_through_its_api_and_ranked(
    fresh_host, owner, team, model_version, exam, client, english
):
    from deployment.rollout import endpoint_deploy

    version = model_version("instruction", name="chat")
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=version)
    converge(fresh_host, endpoint)
    # The version's own evaluation, as an evaluate job registers it.
    ModelEvaluation.objects.create(
        team=team,
        model_version=version,
        dataset_version=exam,
        metrics={"rows": 3, "accuracy_loglik": 1.0, "accuracy_generation": 0.0},
    )

    with pytest.raises(ValidationError, match="no adapter named"):
        endpoint_evaluation_start(
            actor=owner, team=team, endpoint=endpoint, dataset_version=exam, adapter="nope"
        )
    evaluation = endpoint_evaluation_start(
        actor=owner, team=team, endpoint=endpoint, dataset_version=exam, max_new_tokens=8
    )
    assert evaluation.status == "queued" and evaluation.model_version == version
    assert evaluation.endpoint["revisions"] == [
        {"version": version.pk, "name": str(version), "weight": 100}
    ]
    endpoint_evaluation_run(evaluation.pk)  # the Celery task's body
    evaluation.refresh_from_db()
    assert evaluation.status == "done", evaluation.endpoint.get("error")
    metrics = evaluation.metrics
    assert metrics["rows"] == 3 and metrics["choice_rows"] == 2 and metrics["open_rows"] == 1
    assert "accuracy_loglik" not in metrics and 0 <= metrics["accuracy_generation"] <= 1
    assert set(evaluation.subjects) == {"加法", "问答"}
    items = json.loads(default_storage.open(evaluation.items_file).read())
    assert sorted(x["question"] for x in items) == sorted(r[0] for r in QUESTIONS[1:])
    assert [x["row"] for x in items] == [1, 2, 3]
    # What was scored is what the endpoint answers its applications.
    item = next(x for x in items if x["question"] == "5加6等于几？")
    row = dict(zip(QUESTIONS[0], QUESTIONS[2], strict=True))
    asked = endpoint_chat_complete(endpoint=endpoint, messages=choice_prompt(row), max_tokens=8)
    assert item["generated"] == asked and item["type"] == "choice"
    assert evaluation.endpoint["done"] == 3

    # Ranked beside the version's own evaluation, by the figure both have.
    board = leaderboard(exam)
    assert board["ranked_by"] == "accuracy_generation" and len(board["rows"]) == 2
    assert {r["scored"] for r in board["rows"]} == {str(version), endpoint.name}
    client.force_login(owner)
    page = client.get(reverse("training:leaderboard", args=[team.slug, exam.pk])).content.decode()
    assert f'data-endpoint="{endpoint.name}"' in page
    page = client.get(reverse("deployment:endpoint", args=[team.slug, endpoint.pk])).content
    assert b'data-testid="endpoint-evaluate-form"' in page and b'data-status="done"' in page
    page = client.get(reverse("training:model_evaluation", args=[team.slug, evaluation.pk]))
    assert b'data-testid="evaluated-endpoint"' in page.content

    # A question past the model's context (512) is refused by the endpoint: scored wrong with
    # the reason, the others answered; a set of such questions only fails, saying why.
    long = "很" * 600 + "好吗？"
    mixed = make_version(
        dataset_create(actor=owner, team=team, name="long", task_kind="evaluation"),
        owner,
        [["question", "references"], [long, "好。"], ["1加2等于几？", "等于3。"]],
    )
    done = endpoint_evaluation_start(
        actor=owner, team=team, endpoint=endpoint, dataset_version=mixed, max_new_tokens=4
    )
    with translation.override("en"):
        endpoint_evaluation_run(done.pk)
    done.refresh_from_db()
    assert done.status == "done" and done.endpoint["refused"] == 1
    items = json.loads(default_storage.open(done.items_file).read())
    refused = next(x for x in items if x["question"] == long)
    assert "context" in refused["error"] and refused["generated"] == ""
    assert all("error" not in x for x in items if x["question"] != long)
    page = client.get(reverse("training:model_evaluation", args=[team.slug, done.pk]))
    assert b'data-testid="refused"' in page.content
    only_long = make_version(
        dataset_create(actor=owner, team=team, name="only-long", task_kind="evaluation"),
        owner,
        [["question", "references"], [long, "好。"]],
    )
    failed = endpoint_evaluation_start(
        actor=owner, team=team, endpoint=endpoint, dataset_version=only_long
    )
    with translation.override("en"):
        failed = endpoint_evaluation_run(failed.pk)
    assert failed.status == "failed" and "refused every question" in failed.endpoint["error"]

    # Through the API; then the endpoint deleted before its run: failed, saying why.
    api = client.post(
        reverse("deployment:api_endpoint_evaluations", args=[team.slug, endpoint.pk]),
        {"evaluation_set": exam.pk, "max_new_tokens": 4},
        content_type="application/json",
    )
    assert api.status_code == 201 and api.json()["status"] == "queued"
    listed = client.get(
        reverse("deployment:api_endpoint_evaluations", args=[team.slug, endpoint.pk])
    ).json()
    assert listed["count"] == 4
    endpoint.delete()
    with translation.override("en"):  # the client's requests ran in Chinese
        failed = endpoint_evaluation_run(api.json()["id"])
    assert failed.status == "failed" and "deleted" in failed.endpoint["error"]
    assert len(leaderboard(exam)["rows"]) == 2  # a failed evaluation is not ranked
    assert len(leaderboard(only_long)["rows"]) == 0


# The run of a worker killed (SIGKILL) just after its first checkpoint: nothing after it runs.
KILLED_AFTER_CHECKPOINT = """
import os, signal, sys
import django
django.setup()
from deployment import evaluations
kept = evaluations._checkpoint
def kept_then_killed(*args):
    kept(*args)
    os.kill(os.getpid(), signal.SIGKILL)
evaluations._checkpoint = kept_then_killed
evaluations.endpoint_evaluation_run(int(sys.argv[1]))
"""


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_worker_was_killed_asks_only_the_questions_after_its_checkpoint(
    fresh_host, owner, team, model_version, monkeypatch
):
    from django.db import transaction

    from deployment import evaluations, tasks
    from deployment.rollout import endpoint_deploy

    endpoint = endpoint_deploy(
        actor=owner, team=team, model_version=model_version("instruction", name="chat")
    )
    converge(fresh_host, endpoint)
    sums = [(a, b) for a in range(6) for b in range(5)]
    rows = [
        [f"{a}加{b}等于几？", *(str(a + b + k) for k in range(4)), "A", "", "加法"] for a, b in sums
    ]
    with transaction.atomic():  # the import runs here, as in a `db` test
        exam = make_version(
            dataset_create(actor=owner, team=team, name="sums", task_kind="evaluation"),
            owner,
            [QUESTIONS[0], *rows],
        )
    # This test is the worker: the task's runs are the two below.
    queued = []
    monkeypatch.setattr(tasks.evaluate_endpoint, "delay", queued.append)
    evaluation = endpoint_evaluation_start(
        actor=owner, team=team, endpoint=endpoint, dataset_version=exam
    )
    assert queued == [evaluation.pk]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": suite_database_url(),
    }
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_CHECKPOINT, str(evaluation.pk)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    evaluation.refresh_from_db()
    assert evaluation.status == "running" and evaluation.endpoint["done"] == 20
    checkpoint = evaluation.endpoint["checkpoint"]
    assert default_storage.exists(checkpoint)

    asked = []

    def counted(**kwargs):
        asked.append(kwargs["messages"])
        return endpoint_chat_complete(**kwargs)

    monkeypatch.setattr(evaluations, "endpoint_chat_complete", counted)
    endpoint_evaluation_run(evaluation.pk)  # the task, given back, runs again
    evaluation.refresh_from_db()
    assert evaluation.status == "done", evaluation.endpoint.get("error")
    items = json.loads(default_storage.open(evaluation.items_file).read())
    assert [x["row"] for x in items] == list(range(1, len(rows) + 1))
    assert sorted(x["question"] for x in items) == sorted(r[0] for r in rows)
    # The kept answers were not asked again; the others were, once each.
    questions = [r[0] for r in rows]
    asked = [q for m in asked for q in questions if f"\n{q}\n" in m[-1]["content"]]
    assert sorted(asked) == sorted(x["question"] for x in items[20:])
    assert evaluation.metrics["rows"] == len(rows) and evaluation.endpoint["done"] == len(rows)
    assert "checkpoint" not in evaluation.endpoint and not default_storage.exists(checkpoint)


@pytest.mark.django_db
def test_what_an_endpoint_evaluation_refuses(owner, team, exam, model_version, english):
    from deployment.models import Endpoint
    from deployment.rollout import endpoint_deploy

    classifier = endpoint_deploy(actor=owner, team=team, model_version=model_version())
    with pytest.raises(ValidationError, match="not a large model"):
        endpoint_evaluation_start(actor=owner, team=team, endpoint=classifier, dataset_version=exam)
    chat = Endpoint.objects.create(team=team, name="chat-x", task_kind="instruction")
    with pytest.raises(ValidationError, match="serves no model version"):
        endpoint_evaluation_start(actor=owner, team=team, endpoint=chat, dataset_version=exam)
    with pytest.raises(ValidationError, match="New tokens"):
        endpoint_evaluation_start(
            actor=owner, team=team, endpoint=chat, dataset_version=exam, max_new_tokens=0
        )
    exam.row_count = 2001
    with pytest.raises(ValidationError, match="at most 2000"):
        endpoint_evaluation_start(actor=owner, team=team, endpoint=chat, dataset_version=exam)
