"""Annotations made through Label Studio's API, taken in by the sync: created, changed,
deleted, and checked (Label Studio accepts results outside the labeling config)."""

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from console.models import AuditEvent
from labeling import label_studio
from labeling.datasets import dataset_create
from labeling.models import Annotation
from labeling.projects import (
    PUSH_WINDOW,
    WEBHOOK_SECRET_HEADER,
    labeling_project_create,
    labeling_project_push,
    labeling_project_webhook_register,
    labeling_projects_push_again,
)
from labeling.sync import labeling_project_sync
from tests.helpers.data import make_jsonl_version, make_version, reviews_dataset
from tests.helpers.label_studio import (
    UNLABELED_REVIEWS,
    choice,
    member_account,
    needs_label_studio,
    push_project,
    reviews_project,
    task_ids,
)

pytestmark = needs_label_studio


@pytest.fixture
def project(owner, team):
    """Three unlabeled reviews, pushed to Label Studio."""
    return reviews_project(team, owner, "同步")


def test_sync_takes_in_created_changed_and_deleted_annotations(project):
    ls = label_studio.client(project.team)
    ids = task_ids(project)
    first = ls.annotations.create(id=ids[1], result=choice("正面"))
    ls.annotations.create(id=ids[2], result=choice("中性"))  # not in the label set
    counts = labeling_project_sync(project.pk)
    assert counts == {"created": 2, "updated": 0, "deleted": 0, "invalid": 1}
    good = Annotation.objects.get(ls_annotation_id=first.id)
    assert good.valid and good.value == {"label": "正面"} and good.task.row == 1
    bad = Annotation.objects.get(valid=False)
    assert "中性" in bad.error and bad.task.row == 2
    # The audit log says whose annotations came in (here the team's service account in Label
    # Studio, which has no platform account: named by the e-mail).
    (event,) = AuditEvent.objects.filter(action="labeling_project.annotations")
    assert event.team == project.team and event.target_id == str(project.pk)
    assert event.actor is None and event.actor_username == good.annotator != ""
    assert event.data == {"created": 2}

    # Nothing changed: nothing to do.
    assert labeling_project_sync(project.pk)["updated"] == 0
    ls.annotations.update(id=first.id, result=choice("负面"))
    assert labeling_project_sync(project.pk)["updated"] == 1
    good.refresh_from_db()
    assert good.value == {"label": "负面"}

    ls.annotations.delete(id=first.id)
    assert labeling_project_sync(project.pk)["deleted"] == 1
    assert not Annotation.objects.filter(ls_annotation_id=first.id).exists()
    # A sync that took nothing in is not in the audit log.
    events = AuditEvent.objects.filter(action="labeling_project.annotations").order_by("pk")
    assert [e.data for e in events] == [{"created": 2}, {"updated": 1}, {"deleted": 1}]


def test_ner_annotations_are_checked_against_the_text(owner, team):
    dataset = dataset_create(actor=owner, team=team, name="实体", task_kind="ner")
    version = make_jsonl_version(dataset, owner, [{"text": "张三在北京工作"}], {"text": "text"})
    project = push_project(owner, version, "实体标注", labels=["PER", "LOC"])
    (task_id,) = task_ids(project).values()

    def span(start, end, label):
        return {
            "from_name": "entities",
            "to_name": "text",
            "type": "labels",
            "value": {"start": start, "end": end, "labels": [label]},
        }

    ls = label_studio.client(project.team)
    ls.annotations.create(id=task_id, result=[span(0, 2, "PER"), span(3, 5, "LOC")])
    ls.annotations.create(id=task_id, result=[span(3, 50, "LOC")])
    labeling_project_sync(project.pk)
    good = Annotation.objects.get(valid=True)
    assert good.value == {
        "entities": [{"start": 0, "end": 2, "label": "PER"}, {"start": 3, "end": 5, "label": "LOC"}]
    }
    bad = Annotation.objects.get(valid=False)
    assert "outside the text" in bad.error


@pytest.mark.django_db(transaction=True)
def test_a_webhook_from_label_studio_brings_the_annotation(
    owner, team, live_server, settings, celery_worker_process
):
    import time

    settings.PLATFORM_URL = live_server.url
    dataset = reviews_dataset(team, owner, "评论")
    version = make_version(dataset, owner)
    project = labeling_project_create(actor=owner, version=version, name="钩子")
    deadline = time.monotonic() + 60
    while project.status != "ready":  # the worker pushes it
        assert time.monotonic() < deadline, project.error
        time.sleep(0.3)
        project.refresh_from_db()
    # The worker registered the default PLATFORM_URL; this test's server is elsewhere.
    labeling_project_webhook_register(project)
    hooks = label_studio.client(team).webhooks.list(project=project.ls_project_id)
    assert [h.url for h in hooks] == [f"{live_server.url}/hooks/label-studio/{project.pk}/"]
    label_studio.client(team).annotations.create(
        id=task_ids(project)[1], result=choice("正面"), completed_by=member_account(team, owner)
    )
    deadline = time.monotonic() + 30
    while not Annotation.objects.filter(project=project).exists():
        assert time.monotonic() < deadline, "the webhook did not bring the annotation"
        time.sleep(0.5)
    assert Annotation.objects.get(project=project).value == {"label": "正面"}


def test_webhook_with_a_wrong_secret_is_404(client, project):
    """The secret comes in a header, never in the URL (which access logs keep)."""
    header = {"headers": {WEBHOOK_SECRET_HEADER: "wrong"}}
    assert client.post(f"/hooks/label-studio/{project.pk}/", **header).status_code == 404
    assert client.post(f"/hooks/label-studio/{project.pk}/").status_code == 404
    assert client.post("/hooks/label-studio/999999/", **header).status_code == 404


def test_reconciliation_gets_what_no_webhook_announced(project, settings):
    """With the webhook receiver unreachable, the scheduled reconciliation still takes in
    every annotation."""
    from labeling.tasks import reconcile_labeling_projects

    settings.CELERY_TASK_ALWAYS_EAGER = True
    from console.celery import app

    app.conf.task_always_eager = True
    try:
        ls = label_studio.client(project.team)
        for row, task_id in task_ids(project).items():
            ls.annotations.create(id=task_id, result=choice("正面" if row % 2 else "负面"))
        reconcile_labeling_projects()
    finally:
        app.conf.task_always_eager = False
    assert Annotation.objects.filter(project=project, valid=True).count() == 3


def test_label_studio_down_mid_sync_loses_nothing(project, settings):
    """Label Studio unreachable: the sync fails as a whole and changes nothing; once it is
    back, the next sync takes in everything."""
    import httpx

    from labeling.label_studio import _client

    ls = label_studio.client(project.team)
    ids = task_ids(project)
    ls.annotations.create(id=ids[1], result=choice("正面"))
    labeling_project_sync(project.pk)
    ls.annotations.create(id=ids[2], result=choice("负面"))
    up = settings.LABEL_STUDIO_URL
    settings.LABEL_STUDIO_URL = "http://127.0.0.1:9"  # nothing listens there: "down"
    _client.cache_clear()
    with pytest.raises(httpx.ConnectError):
        labeling_project_sync(project.pk)
    assert Annotation.objects.filter(project=project).count() == 1
    settings.LABEL_STUDIO_URL = up
    assert labeling_project_sync(project.pk)["created"] == 1
    assert Annotation.objects.filter(project=project).count() == 2


def test_push_while_label_studio_is_down_says_so_and_retries(owner, team, settings):
    from labeling.label_studio import _client
    from labeling.models import LabelingProject
    from labeling.tasks import push_labeling_project

    dataset = reviews_dataset(team, owner, "重试")
    version = make_version(dataset, owner)
    project = labeling_project_create(actor=owner, version=version, name="等待")
    up = settings.LABEL_STUDIO_URL
    settings.LABEL_STUDIO_URL = "http://127.0.0.1:9"
    _client.cache_clear()
    # Run in this process, the task's retries follow at once; a worker spaces them out.
    assert push_labeling_project.apply(args=[project.pk]).state == "FAILURE"
    project.refresh_from_db()
    assert project.status == LabelingProject.Status.FAILED
    assert project.error.startswith("Label Studio:")
    # The reconciliation pushes failed projects again, each once until that push gives up
    # (it runs every minute; a push retries for about an hour); Label Studio is back.
    settings.LABEL_STUDIO_URL = up
    assert labeling_projects_push_again() == [project.pk]
    assert labeling_projects_push_again() == []
    project.refresh_from_db()
    assert project.status == LabelingProject.Status.CREATING
    assert push_labeling_project.apply(args=[project.pk]).state == "SUCCESS"
    project.refresh_from_db()
    assert project.status == "ready" and project.error == "" and project.tasks_pushed == 3
    assert labeling_projects_push_again() == []
    # A push queued hours ago that never ended (its message lost with Redis, say) is claimed
    # again; one queued a moment ago is left to run.
    long_ago = timezone.now() - PUSH_WINDOW - timedelta(minutes=1)
    LabelingProject.objects.filter(pk=project.pk).update(status="creating", push_queued_at=long_ago)
    assert labeling_projects_push_again() == [project.pk]
    assert labeling_projects_push_again() == []


@pytest.mark.django_db(transaction=True)
def test_two_pushes_of_one_project_at_once_make_one_label_studio_project(
    owner, team, monkeypatch, celery_worker_process
):
    """A retry that overlaps a push still running (a worker's redelivery, a slow Label
    Studio) waits for it: one Label Studio project, each row one task."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL (CI); SQLite runs one writer at a time")
    from labeling.tasks import push_labeling_project

    # The pushes below are the two at once; no worker is running to take the create's own.
    monkeypatch.setattr(push_labeling_project, "delay", lambda *args, **kwargs: None)
    version = make_version(reviews_dataset(team, owner, "并发"), owner, UNLABELED_REVIEWS)
    project = labeling_project_create(actor=owner, version=version, name="并发推送")
    # The team's projects in Label Studio before the pushes (its first use: the organisation
    # and account are made here).
    ls = label_studio.client(team)
    before = {p.id for p in ls.projects.list()}
    start, errors = threading.Barrier(2), []

    def push() -> None:
        try:
            start.wait()
            labeling_project_push(project.pk)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    pushes = [threading.Thread(target=push) for _ in range(2)]
    for thread in pushes:
        thread.start()
    for thread in pushes:
        thread.join(60)
    assert errors == []
    project.refresh_from_db()
    made = {p.id for p in ls.projects.list()} - before
    assert made == {project.ls_project_id}
    assert ls.projects.get(id=project.ls_project_id).task_number == 3
    assert project.tasks.count() == 3 and project.status == "ready"


def test_an_annotator_labels_as_themself_without_a_label_studio_password(
    client, make_user, team, project
):
    """The console's hand-off: the platform logs the annotator into their own Label Studio
    account; what they annotate there is attributed to them."""
    import httpx

    from console.models import Membership

    annotator = make_user("xiaoli")
    Membership.objects.create(team=team, user=annotator, role="annotator")
    client.force_login(annotator)
    response = client.get(f"/t/{team.slug}/labeling/{project.pk}/open/")
    assert response.status_code == 302
    assert response["Location"].endswith(f"/projects/{project.ls_project_id}/data?labeling=1")
    session = response.cookies["sessionid"].value
    base = label_studio.settings.LABEL_STUDIO_URL
    with httpx.Client(base_url=base, cookies={"sessionid": session}) as browser:
        me = browser.get("/api/current-user/whoami").json()
        assert me["email"] == f"u{annotator.pk}@{settings.LABEL_STUDIO_ACCOUNT_DOMAIN}"
        assert me["first_name"] == "xiaoli"
        browser.get("/projects/")  # Label Studio sets its CSRF cookie on a page
        made = browser.post(
            f"/api/tasks/{task_ids(project)[1]}/annotations/",
            json={"result": choice("正面")},
            headers={
                "X-CSRFToken": browser.cookies.get("csrftoken", ""),
                "Referer": f"{base}/projects/",
            },
        )
        assert made.status_code == 201, made.text
    labeling_project_sync(project.pk)
    assert Annotation.objects.get(project=project).annotator == "xiaoli"
    # The second visit logs in to the same account.
    again = client.get(f"/t/{team.slug}/labeling/{project.pk}/open/")
    assert again.status_code == 302 and again.cookies["sessionid"].value


def test_viewers_cannot_open_label_studio(client, make_user, team, project):
    from console.models import Membership

    viewer = make_user("guest")
    Membership.objects.create(team=team, user=viewer, role="viewer")
    client.force_login(viewer)
    assert client.get(f"/t/{team.slug}/labeling/{project.pk}/open/").status_code == 403


def test_a_webhook_registered_under_an_old_url_is_registered_again(project, settings):
    """Registered before PLATFORM_URL (or the route) changed, e.g. with its secret in the URL
    as earlier releases did: the next sync registers it again, its secret in a header."""
    project.refresh_from_db()
    old = f"{settings.PLATFORM_URL}/hooks/label-studio/{project.pk}/old-secret-in-url/"
    type(project).objects.filter(pk=project.pk).update(webhook_url=old)
    settings.PLATFORM_URL = "http://127.0.0.1:8999"

    labeling_project_sync(project.pk)
    project.refresh_from_db()
    expected = f"http://127.0.0.1:8999/hooks/label-studio/{project.pk}/"
    assert project.webhook_url == expected
    hooks = label_studio.client(project.team).webhooks.list(project=project.ls_project_id)
    assert [h.url for h in hooks] == [expected]
    assert WEBHOOK_SECRET_HEADER in (hooks[0].headers or {})


def test_the_team_is_told_once_when_every_task_is_annotated(project, owner):
    from console.models import Notification

    ls = label_studio.client(project.team)
    who = member_account(project.team, owner)  # only the members' annotations count
    *first, final = task_ids(project).values()
    for task in first:
        ls.annotations.create(id=task, result=choice("正面"), completed_by=who)
    labeling_project_sync(project.pk)
    assert not Notification.objects.filter(event="labeling_finished").exists()
    last = ls.annotations.create(id=final, result=choice("负面"), completed_by=who)
    labeling_project_sync(project.pk)
    (told,) = Notification.objects.filter(team=project.team, event="labeling_finished")
    assert project.name in told.title and told.link.endswith(f"/labeling/{project.pk}/")
    ls.annotations.update(id=last.id, result=choice("正面"))
    labeling_project_sync(project.pk)
    assert Notification.objects.filter(event="labeling_finished").count() == 1
