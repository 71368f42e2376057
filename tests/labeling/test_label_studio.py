"""The real Label Studio server that `make test` starts (platform/label_studio.py run)."""

import uuid
from xml.etree import ElementTree

import pytest
from django.test import override_settings

from labeling import label_studio, task_kinds
from runtime.kinds import TaskKind
from tests.helpers.label_studio import needs_label_studio


@needs_label_studio
def test_label_studio_is_alive_and_takes_the_token():
    check = label_studio.check_health()
    assert check.ok, check.detail
    assert "Label Studio" in check.detail


@needs_label_studio
@pytest.mark.parametrize("kind", list(TaskKind))
def test_each_task_kind_makes_a_label_studio_project(kind):
    ls = label_studio.client()
    config = task_kinds.get(kind).label_config(["正面", "负面", "中性"])
    project = ls.projects.create(title=f"test-{kind}-{uuid.uuid4().hex[:8]}", label_config=config)
    try:
        stored = ls.projects.get(id=project.id)
        if not task_kinds.get(kind).takes_labels:  # an answer to write, choose or compare
            expected = {"instruction": "TextArea", "preference": "Pairwise"}.get(kind, "Choices")
            assert expected in stored.label_config
        else:
            assert "正面" in stored.label_config and "负面" in stored.label_config
    finally:
        ls.projects.delete(id=project.id)


def test_label_configs_escape_labels_and_give_hotkeys():
    for schema in task_kinds.KINDS.values():
        if not schema.takes_labels:
            continue
        root = ElementTree.fromstring(schema.label_config(["A&B", 'say "hi"', "<x>"]))
        values = [e.get("value") for e in root.iter() if e.tag in ("Choice", "Label")]
        assert values == ["A&B", 'say "hi"', "<x>"]
        assert [e.get("hotkey") for e in root.iter() if e.tag in ("Choice", "Label")] == [
            "1",
            "2",
            "3",
        ]
    ner = ElementTree.fromstring(task_kinds.get("ner").label_config(["PER"]))
    assert ner.find("Text").get("granularity") == "symbol"


@override_settings(LABEL_STUDIO_URL="http://127.0.0.1:1", LABEL_STUDIO_TOKEN="x")
def test_label_studio_down_is_reported_with_what_waits(owner, team):
    from labeling.datasets import dataset_create
    from labeling.projects import labeling_project_create
    from tests.helpers.data import make_version

    check = label_studio.check_health()
    assert not check.ok and "127.0.0.1:1" in check.detail and "waiting" not in check.detail
    dataset = dataset_create(actor=owner, team=team, name="d", task_kind="ner")
    version = make_version(dataset, owner, [["text"], ["张三"]])
    labeling_project_create(actor=owner, version=version, name="p", labels=["PER"])
    from django.utils import translation

    with translation.override("en"):
        assert "1 labeling project(s) waiting to be pushed" in label_studio.check_health().detail


@override_settings(LABEL_STUDIO_URL="")
def test_label_studio_not_configured_is_reported(db):
    assert not label_studio.check_health().ok


@needs_label_studio
def test_first_uses_of_teams_label_studio_at_once_all_succeed(db):
    """Three teams' first pushes at once (three workers): each run on Label Studio's database
    waits for the one before (without, one failed with "database is locked"), and each team's
    service account works."""
    import threading

    from console.models import Team
    from labeling import label_studio_admin

    # Ids no other test's team takes (SQLite gives a rolled-back id again), so that the
    # accounts made here in the session's Label Studio are these teams' alone.
    teams = []
    for i in range(3):
        slug = f"bingfa{i}-{uuid.uuid4().hex[:6]}"
        teams.append(Team.objects.create(pk=10**8 + uuid.uuid4().int % 10**8, name=slug, slug=slug))
    start, errors = threading.Barrier(len(teams)), []

    def first_use(team) -> None:
        try:
            start.wait()
            label_studio_admin.team_ensure(team)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(t,)) for t in teams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    domain = label_studio.settings.LABEL_STUDIO_ACCOUNT_DOMAIN
    for team in teams:
        assert label_studio.client(team).users.whoami().email == f"team-{team.pk}@{domain}"
