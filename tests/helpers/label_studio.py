"""Label Studio: labeling projects made and pushed as the Celery task does, and annotations
made through Label Studio's API as the team's labeling members."""

from __future__ import annotations

import importlib.util
import os
import uuid

import pytest

from tests.helpers.data import make_version, reviews_dataset
from tests.helpers.system import ROOT

needs_label_studio = pytest.mark.skipif(
    not os.environ.get("LABEL_STUDIO_URL") and not os.environ.get("CI"),
    reason="Label Studio tests skipped: LABEL_STUDIO_URL is not set (run them with `make test`)",
)
# Three reviews for annotators to label (header first).
UNLABELED_REVIEWS = [["text", "label"], ["房间干净", ""], ["早餐很差", ""], ["服务热情", ""]]


def push_project(owner, version, name: str, **options):
    """A labeling project of ``version``, made and pushed to Label Studio (what the Celery task
    does)."""
    from labeling.projects import labeling_project_create, labeling_project_push

    created = labeling_project_create(actor=owner, version=version, name=name, **options)
    return labeling_project_push(created.pk)


def reviews_project(team, owner, name: str, dataset_name: str = "评论", **options):
    """A pushed labeling project of UNLABELED_REVIEWS in a new reviews dataset."""
    version = make_version(reviews_dataset(team, owner, dataset_name), owner, UNLABELED_REVIEWS)
    return push_project(owner, version, name, **options)


def task_ids(project) -> dict[int, int]:
    """The Label Studio task id of each row of ``project``."""
    return dict(project.tasks.values_list("row", "ls_task_id"))


def region(from_name: str, to_name: str, kind: str, value: dict) -> dict:
    """One region of an annotation's result, as Label Studio's API takes it."""
    return {"from_name": from_name, "to_name": to_name, "type": kind, "value": value}


def choice(label: str) -> list[dict]:
    """An annotation's result choosing ``label`` (the classification label config)."""
    return [region("label", "text", "choices", {"choices": [label]})]


def member_account(team, user) -> int:
    """The Label Studio user id of ``user``'s account, ``user`` being a labeling member of
    ``team`` (made through the team's service account: quicker than the console's hand-over).
    Only annotations by such accounts count; the tests annotate as them (``completed_by``)."""
    from labeling import label_studio
    from labeling.models import LabelStudioAccount

    account = LabelStudioAccount.objects.filter(user=user).first()
    if account is not None:
        return account.ls_user_id
    tag = f"{user.username}-{uuid.uuid4().hex[:8]}"
    person = label_studio.client(team).users.create(username=tag, email=f"{tag}@example.com")
    LabelStudioAccount.objects.create(
        user=user, ls_user_id=person.id, email=person.email, active_team=team
    )
    return person.id


def annotate(team, user, task_id: int, result: list[dict]) -> None:
    """``user`` annotates Label Studio task ``task_id`` with ``result``."""
    from labeling import label_studio

    label_studio.client(team).annotations.create(
        id=task_id, completed_by=member_account(team, user), result=result
    )


def launcher():
    """platform/label_studio.py, loaded by path (``platform`` is not a package): to start a
    Label Studio of a test's own."""
    spec = importlib.util.spec_from_file_location("ls_launcher", ROOT / "platform/label_studio.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
