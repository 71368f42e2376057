"""Export of a labeling project to a new version, with each conflict rule, and agreement."""

import uuid

import pytest

from console.models import Membership
from console.roles import Role
from labeling import label_studio
from labeling.consensus import cohen_kappa, resolve
from labeling.exports import labeling_project_export
from labeling.imports import import_run
from labeling.sync import labeling_project_sync
from tests.helpers.label_studio import (
    choice,
    member_account,
    needs_label_studio,
    reviews_project,
    task_ids,
)


def test_cohen_kappa_on_a_known_case():
    assert cohen_kappa(list("aabb"), list("abbb")) == pytest.approx(0.5)
    assert cohen_kappa(list("abab"), list("abab")) == 1.0
    assert cohen_kappa([], []) is None


def test_conflict_rules():
    answers = [("u1", {"label": "a"}), ("u2", {"label": "a"}), ("u3", {"label": "b"})]
    assert resolve(answers, "majority") == {"label": "a"}
    assert resolve(answers, "drop") is None
    assert resolve(answers, "reviewer", reviewer="u3") == {"label": "b"}
    assert (
        resolve([*answers[:2], ("u3", {"label": "b"}), ("u4", {"label": "b"})], "majority") is None
    )  # a tie has no majority
    spans = [
        ("u1", {"entities": [{"start": 0, "end": 2, "label": "PER"}]}),
        (
            "u2",
            {
                "entities": [
                    {"start": 0, "end": 2, "label": "PER"},
                    {"start": 3, "end": 5, "label": "LOC"},
                ]
            },
        ),
    ]
    assert resolve(spans, "majority") == {"entities": [{"start": 0, "end": 2, "label": "PER"}]}


@needs_label_studio
@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("majority", {1: "正面", 2: "负面", 3: None}),
        ("drop", {2: "负面", 3: None}),
        ("reviewer", {1: "负面", 2: "负面", 3: None}),
    ],
)
def test_export_makes_a_version_with_the_agreed_labels(owner, team, make_user, rule, expected):
    project = reviews_project(team, owner, "导出", dataset_name=f"评论-{rule}", overlap=3)
    version = project.source_version
    ls = label_studio.client(team)
    # Annotators of the team, each with their Label Studio account.
    users = [make_user(f"a{i}-{uuid.uuid4().hex[:6]}") for i in range(3)]
    for user in users:
        Membership.objects.create(team=team, user=user, role=Role.ANNOTATOR)
    people = [member_account(team, user) for user in users]
    ids = task_ids(project)
    for person, label in zip(people, ["正面", "正面", "负面"], strict=True):
        ls.annotations.create(id=ids[1], result=choice(label), completed_by=person)
    ls.annotations.create(id=ids[2], result=choice("负面"), completed_by=people[0])
    labeling_project_sync(project.pk)

    job = labeling_project_export(
        actor=owner, project=project, rule=rule, reviewer=users[2].username
    )
    job = import_run(job.pk)
    exported = job.version
    assert exported.source == "labeling" and exported.parent == version
    assert exported.lineage["labeling_project"] == project.pk
    import json

    from django.core.files.storage import default_storage

    def rows_of(v):
        with default_storage.open(v.data_file, "rb") as f:
            return [json.loads(line) for line in f]

    source = {r["text"]: r for r in rows_of(version)}
    got = rows_of(exported)
    by_row = {list(source).index(r["text"]) + 1: r["label"] for r in got}
    assert by_row == expected
    assert all(r["split"] == source[r["text"]]["split"] for r in got)  # splits kept


def test_agreement_per_pair_per_label_and_disputed_rows():
    from labeling.consensus import agreement

    def lab(x):
        return {"label": x}

    answers = {
        1: [("u1", lab("a")), ("u2", lab("a"))],
        2: [("u1", lab("a")), ("u2", lab("b"))],
        3: [("u1", lab("b")), ("u2", lab("b"))],
        4: [("u1", lab("b")), ("u2", lab("b"))],
    }
    result = agreement(answers, "text_classification")
    # u1: a a b b, u2: a b b b  → kappa 0.5
    assert result["pairs"] == [{"a": "u1", "b": "u2", "items": 4, "score": pytest.approx(0.5)}]
    assert result["labels"]["a"] == {"rows": 2, "agreement": 0.5}
    assert result["disputed"] == [{"row": 2, "answers": 2}]
    spans = {
        1: [
            ("u1", {"entities": [{"start": 0, "end": 2, "label": "PER"}]}),
            (
                "u2",
                {
                    "entities": [
                        {"start": 0, "end": 2, "label": "PER"},
                        {"start": 3, "end": 5, "label": "LOC"},
                    ]
                },
            ),
        ]
    }
    ner = agreement(spans, "ner")
    assert ner["pairs"][0]["score"] == pytest.approx(2 / 3)
    assert ner["labels"]["PER"]["agreement"] == 1.0 and ner["labels"]["LOC"]["agreement"] == 0.0
