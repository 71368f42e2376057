"""The team's landing page: what trains, the newest models with their figure, what serves with
its last hour, labeling progress, storage and recent work, each linked; nothing of another
team's."""

import re
from datetime import timedelta

from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils import timezone

from console import quotas
from console.models import Role
from deployment.models import Endpoint, MetricSample
from labeling.datasets import dataset_create
from labeling.models import Annotation, LabelingProject, LabelingTask
from tests.helpers.data import make_version
from tests.helpers.models import stored_model
from training.jobs import training_job_submit
from training.models import TrainingJob


def _panel(page: str, name: str) -> str:
    found = re.search(rf'<section class="card" data-panel="{name}".*?</section>', page, re.S)
    assert found, name
    return found.group(0)


def _team_with_work(team, owner, tmp_path, tag: str) -> dict:
    dataset = dataset_create(
        actor=owner, team=team, name=f"评论{tag}", task_kind="text_classification"
    )
    version = make_version(dataset, owner)
    queued = training_job_submit(actor=owner, team=team, dataset_version=version, name=f"q{tag}")
    running = training_job_submit(actor=owner, team=team, dataset_version=version, name=f"r{tag}")
    TrainingJob.objects.filter(pk=running.pk).update(
        status=TrainingJob.Status.RUNNING, step=30, total_steps=120
    )
    model = stored_model(
        team,
        owner,
        tmp_path / tag,
        name=f"model{tag}",
        metrics={"accuracy": 0.9, "macro_f1": 0.8765},
    )
    project = LabelingProject.objects.create(
        team=team, source_version=version, name=f"标注{tag}", status="ready", tasks_total=4
    )
    tasks = [LabelingTask.objects.create(project=project, row=i, ls_task_id=i) for i in (1, 2, 3)]
    for n, (task, valid) in enumerate(zip(tasks, (True, True, False), strict=True)):
        Annotation.objects.create(project=project, task=task, ls_annotation_id=n, valid=valid)
    # Two annotators on one task count it once.
    Annotation.objects.create(project=project, task=tasks[0], ls_annotation_id=9)
    endpoint = Endpoint.objects.create(team=team, name=f"ep{tag}", task_kind="text_classification")
    now = timezone.now()
    for minutes_ago, requests, errors in ((50, 40, 0), (10, 60, 3), (90, 1000, 1000)):
        MetricSample.objects.create(
            endpoint=endpoint,
            at=now - timedelta(minutes=minutes_ago),
            window_s=60,
            requests=requests,
            errors=errors,
        )
    return {
        "queued": queued,
        "running": running,
        "model": model,
        "project": project,
        "ep": endpoint,
    }


def test_the_overview_shows_the_teams_work_each_linked(client, owner, team, make_team, tmp_path):
    ours = _team_with_work(team, owner, tmp_path, "A")
    # Tagged in Chinese: a random token of the page (CSRF) cannot hold the names looked for.
    _team_with_work(make_team("Beta", {owner: Role.OWNER}), owner, tmp_path, "乙")
    client.force_login(owner)
    page = client.get(reverse("console:dashboard", kwargs={"team": team.slug})).content.decode()

    def url(name: str, **kwargs) -> str:
        return reverse(name, kwargs={"team": team.slug, **kwargs})

    jobs = _panel(page, "jobs")
    assert 'data-running="1" data-queued="1"' in jobs, jobs
    # Running first, with its progress; each links to its page.
    assert jobs.index(f'data-job="{ours["running"].pk}"') < jobs.index(
        f'data-job="{ours["queued"].pk}"'
    )
    assert 'aria-valuenow="25"' in jobs
    assert url("training:job", training_job_id=ours["running"].pk) in jobs

    models = _panel(page, "models")
    assert url("training:model", model_version_id=ours["model"].pk) in models
    assert '<strong data-metric="macro_f1">0.8765</strong>' in models  # the kind's own figure

    labeling = _panel(page, "labeling")
    assert (
        'aria-valuenow="2"' in labeling and 'aria-valuemax="4"' in labeling
    )  # the invalid one not
    assert url("labeling:project", project_id=ours["project"].pk) in labeling

    endpoints = _panel(page, "endpoints")
    # The last hour only: the sample of 90 minutes ago is not in it.
    assert re.search(r"100\D+3\D", endpoints.split('data-testid="endpoint-hour"')[1]), endpoints
    assert endpoints.count("<polyline") == 2
    assert url("deployment:endpoint", endpoint_id=ours["ep"].pk) in endpoints

    activity = _panel(page, "activity")
    assert 'data-action="training.job_submit"' in activity and "qA" in activity
    assert 'data-action="dataset.create"' in activity

    # Storage: what the team's model version's files take, added up by the database.
    stored = sum(f["size"] for f in ours["model"].files.values())
    assert stored > 0 and ours["model"].stored_bytes == stored
    assert quotas.team_storage_usage(team)["model_versions"] == stored
    assert f"{filesizeformat(stored)}</span>" in _panel(page, "storage")
    for name in ("q乙", "r乙", "model乙", "标注乙", "ep乙", "评论乙"):
        assert name not in page, name
