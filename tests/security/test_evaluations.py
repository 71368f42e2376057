"""Evaluations as an insider would attack them: another team's model version, evaluation set,
leaderboard or evaluation named by id (API and console: 404, nothing queued), and a runner's
evaluation.json past its size limit (refused before it is read). A deleted set's questions do
not stay behind in an evaluation's files."""

import pytest
from django.core.exceptions import ValidationError
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.urls import reverse

from labeling.datasets import dataset_create, dataset_delete
from tests.helpers.data import make_version
from training.evaluations import MAX_EVALUATION_BYTES, evaluation_register, evaluation_submit
from training.models import ModelEvaluation, TrainingJob
from training.registry import model_version_delete

QUESTIONS = [["question", "A", "B", "C", "D", "answer"], ["1+1?", "1", "2", "3", "4", "B"]]


def evaluation_set(actor, team, name: str, rows=QUESTIONS):
    return make_version(
        dataset_create(actor=actor, team=team, name=name, task_kind="evaluation"), actor, rows
    )


@pytest.fixture
def attacker(make_user, make_team, model_version):
    """Mallory, owner of a team of her own with a chat model of its own."""
    from console.roles import Role

    mallory = make_user("mallory")
    evil = make_team("Evil", {mallory: Role.OWNER})
    own_model = model_version("instruction", name="own")
    own_model.team = evil
    own_model.save()
    return mallory, evil, own_model


@pytest.mark.django_db
def test_another_teams_versions_sets_and_evaluations_are_404(
    client, owner, team, attacker, model_version
):
    mallory, evil, own_model = attacker
    victims_set = evaluation_set(owner, team, "内部考试")
    victims_model = model_version("instruction", name="secret")
    evaluation = ModelEvaluation.objects.create(
        team=team,
        model_version=victims_model,
        dataset_version=victims_set,
        metrics={"accuracy_loglik": 0.9},
    )
    own_set = evaluation_set(mallory, evil, "exam")

    with pytest.raises(ValidationError, match="another team"):
        evaluation_submit(
            actor=mallory, team=evil, model_version=own_model, dataset_version=victims_set
        )
    client.force_login(mallory)
    t = evil.slug
    for url, body in (
        (
            reverse("training:api_model_evaluations", args=[t, victims_model.pk]),
            {"evaluation_set": own_set.pk},
        ),
        (
            reverse("training:api_model_evaluations", args=[t, own_model.pk]),
            {"evaluation_set": victims_set.pk},
        ),
    ):
        assert client.post(url, body, content_type="application/json").status_code == 404
    for url in (
        reverse("training:api_model_evaluations", args=[t, victims_model.pk]),
        reverse("training:api_leaderboard", args=[t, victims_set.pk]),
        reverse("training:leaderboard", args=[t, victims_set.pk]),
        reverse("training:leaderboard", args=[t, victims_set.pk]) + "?format=csv",
        reverse("training:model_evaluation", args=[t, evaluation.pk]),
    ):
        assert client.get(url).status_code == 404, url
    r = client.post(
        reverse("training:model", args=[t, own_model.pk]),
        {"action": "evaluate", "evaluation_set": victims_set.pk},
    )
    assert r.status_code == 404
    # Nor does the victim's set show among the evaluation sets offered.
    page = client.get(reverse("training:model", args=[t, own_model.pk])).content.decode()
    assert "内部考试" not in page
    assert not TrainingJob.objects.filter(objective="evaluate").exists()


@pytest.mark.django_db
def test_an_evaluation_file_past_its_limit_is_refused_before_it_is_read(
    owner, team, model_version, tmp_path
):
    exam = evaluation_set(owner, team, "exam")
    job = evaluation_submit(
        actor=owner, team=team, model_version=model_version("instruction"), dataset_version=exam
    )
    with open(tmp_path / "evaluation.json", "wb") as f:
        f.truncate(MAX_EVALUATION_BYTES + 1)  # sparse: read, it would be 64 MB of NULs
    with pytest.raises(ValueError, match="over 64 MB"):
        evaluation_register(job, tmp_path)
    assert not ModelEvaluation.objects.exists()


@pytest.mark.django_db
def test_another_teams_endpoint_never_judges_and_its_evaluations_are_not_judged(
    client, owner, team, attacker, model_version
):
    from deployment.judge import judge_start
    from deployment.rollout import endpoint_deploy

    mallory, evil, evil_model = attacker
    open_question = [["question", "references"], ["3加4等于几？", "等于7。"]]
    exam = evaluation_set(owner, team, "exam", open_question)
    victims = ModelEvaluation.objects.create(
        team=team,
        model_version=model_version("instruction", name="secret"),
        dataset_version=exam,
        metrics={"open_rows": 1},
    )
    evil_judge = endpoint_deploy(actor=mallory, team=evil, model_version=evil_model)
    # Another team's endpoint would read the victim's questions and answers.
    with pytest.raises(ValidationError, match="another team"):
        judge_start(actor=owner, evaluation=victims, endpoint=evil_judge)
    client.force_login(mallory)
    url = reverse("deployment:evaluation_judge", args=[evil.slug, victims.pk])
    assert client.get(url).status_code == 404
    assert client.post(url, {"endpoint": evil_judge.pk, "rubric": "x"}).status_code == 404
    victims.refresh_from_db()
    assert victims.judge == {}


@pytest.mark.django_db
def test_another_teams_endpoint_or_set_is_never_evaluated_and_a_viewer_evaluates_nothing(
    client, owner, team, attacker, make_user, model_version
):
    from console.models import Membership
    from console.roles import Role
    from deployment.evaluations import endpoint_evaluation_start
    from deployment.rollout import endpoint_deploy

    mallory, evil, own_model = attacker
    victims_set = evaluation_set(owner, team, "内部考试")
    victims_endpoint = endpoint_deploy(
        actor=owner, team=team, model_version=model_version("instruction", name="secret")
    )
    own_set = evaluation_set(mallory, evil, "exam")
    own_endpoint = endpoint_deploy(actor=mallory, team=evil, model_version=own_model)

    # The victim's questions asked of her endpoint would leak them, and the victim's endpoint
    # would answer hers on the victim's traffic and keys.
    with pytest.raises(ValidationError, match="another team"):
        endpoint_evaluation_start(
            actor=mallory, team=evil, endpoint=own_endpoint, dataset_version=victims_set
        )
    client.force_login(mallory)
    t = evil.slug
    api = "deployment:api_endpoint_evaluations"
    for endpoint, exam in ((own_endpoint, victims_set), (victims_endpoint, own_set)):
        r = client.post(
            reverse(api, args=[t, endpoint.pk]),
            {"evaluation_set": exam.pk},
            content_type="application/json",
        )
        assert r.status_code == 404
    assert client.get(reverse(api, args=[t, victims_endpoint.pk])).status_code == 404
    r = client.post(
        reverse("deployment:endpoint_evaluate", args=[t, victims_endpoint.pk]),
        {"evaluation_set": own_set.pk, "max_new_tokens": 8},
    )
    assert r.status_code == 404
    # The console's form offers her own sets only; the victim's id is refused.
    client.post(
        reverse("deployment:endpoint_evaluate", args=[t, own_endpoint.pk]),
        {"evaluation_set": victims_set.pk, "max_new_tokens": 8},
    )
    page = client.get(reverse("deployment:endpoint", args=[t, own_endpoint.pk])).content
    assert "内部考试".encode() not in page
    # A viewer of the victim's team reads, never evaluates.
    viewer = make_user("victor")
    Membership.objects.create(team=team, user=viewer, role=Role.VIEWER)
    client.force_login(viewer)
    r = client.post(
        reverse(api, args=[team.slug, victims_endpoint.pk]),
        {"evaluation_set": victims_set.pk},
        content_type="application/json",
    )
    assert r.status_code == 403
    assert not ModelEvaluation.objects.exists()


@pytest.mark.django_db
def test_an_evaluations_files_go_when_its_set_or_its_model_is_deleted(
    owner, team, model_version, django_capture_on_commit_callbacks
):
    chat = model_version("instruction", name="chat")

    def evaluated(exam) -> list[str]:
        """An evaluation of ``chat`` on ``exam`` with its items and an unfinished run's
        checkpoint in storage, as the runs leave them."""
        items = default_storage.save("evaluations/items.json", ContentFile(b'[{"q": "1+1?"}]'))
        partial = default_storage.save("evaluations/partial.json", ContentFile(b"[]"))
        ModelEvaluation.objects.create(
            team=team,
            model_version=chat,
            dataset_version=exam,
            items_file=items,
            endpoint={"checkpoint": partial},
        )
        return [items, partial]

    exam = evaluation_set(owner, team, "内部考试")
    files = evaluated(exam)
    with django_capture_on_commit_callbacks(execute=True):
        dataset_delete(actor=owner, dataset=exam.dataset)
    assert not ModelEvaluation.objects.exists()
    assert not [name for name in files if default_storage.exists(name)]

    files = evaluated(evaluation_set(owner, team, "复试"))
    with django_capture_on_commit_callbacks(execute=True):
        model_version_delete(actor=owner, version=chat)
    assert not ModelEvaluation.objects.exists()
    assert not [name for name in files if default_storage.exists(name)]
