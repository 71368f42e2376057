"""Console pages and API lists need as many database queries with 10,000 objects as with 10.

Two teams are filled once for the module, by ``bulk_create`` (not through services: 10,000 rows
of each kind in seconds): ``small`` with 10 objects of every kind and ``big`` with 10,000 —
members, API tokens, datasets (each with a version, and one dataset with as many versions),
labeling projects, base models, training jobs, model versions, endpoints (each with an active
revision placed on a host, and one endpoint with as many revisions and keys) and audit events.
Each page is requested for the small team (after a first request that fills caches), its
queries counted, and then for the big team within that count. The big team's page must also
show one page of objects and a link to the next (a page of 10,000 rows is a bug of its own).

Nodes and accounts are the site's, not a team's: their pages are measured, then 10,000 more
are added and the pages measured again.
"""

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from console.models import ApiToken, AuditEvent, Device, Membership, Node, Team
from console.pagination import PAGE_SIZE
from console.pickers import PAGE as PICKER_PAGE
from console.roles import Role
from deployment.models import Endpoint, EndpointKey, Placement, Revision, ServingHost
from labeling.models import Dataset, DatasetVersion, LabelingProject
from training.models import BaseModel, ModelVersion, TrainingJob

# Its module-scoped fixtures: the module runs whole in one process of the suite (Makefile).
pytestmark = pytest.mark.xdist_group("query-counts")

SMALL, BIG = 10, 10_000
KIND = "text_classification"


@dataclass
class Side:
    """One team filled with ``n`` objects of every kind, and its owner."""

    n: int
    team: Team
    owner: object
    dataset: Dataset  # the dataset with n versions
    endpoint: Endpoint  # the endpoint with n revisions and n keys


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _versions(datasets: list[Dataset], numbers: range, owner) -> list[DatasetVersion]:
    return DatasetVersion.objects.bulk_create(
        DatasetVersion(
            dataset=dataset,
            number=number,
            source=DatasetVersion.Source.UPLOAD,
            created_by=owner,
            content_hash=_digest(f"{dataset.pk}-{number}"),
            format="csv",
            row_count=3,
            rejected_count=0,
            duplicate_count=0,
            split_counts={"train": 2, "dev": 1},
            stats={"labels": {"正面": 2, "负面": 1}},
            data_file=f"bench/{dataset.pk}/{number}.jsonl",
            report_file=f"bench/{dataset.pk}/{number}.report.jsonl",
        )
        for dataset in datasets
        for number in numbers
    )


def fill(name: str, n: int, host: ServingHost) -> Side:
    user_model = get_user_model()
    owner = user_model.objects.create_user(username=f"{name}-owner", password="pw-Secret-123")
    team = Team.objects.create(name=name, slug=name)
    Membership.objects.create(team=team, user=owner, role=Role.OWNER)
    members = user_model.objects.bulk_create(
        user_model(username=f"{name}-member-{i}", password="!") for i in range(n - 1)
    )
    Membership.objects.bulk_create(
        Membership(team=team, user=user, role=Role.VIEWER) for user in members
    )
    ApiToken.objects.bulk_create(
        ApiToken(user=owner, name=f"t{i}", prefix="mp_x", key_hash=_digest(f"{name}-token-{i}"))
        for i in range(n)
    )
    AuditEvent.objects.bulk_create(
        AuditEvent(
            team=team,
            actor=owner,
            actor_username=owner.username,
            action=f"load.test{i % 5}",
            target_repr=f"#{i}",
            data={"i": i},
        )
        for i in range(n)
    )
    # A query per row (a version count not annotated, say) shows with or without versions.
    Dataset.objects.bulk_create(
        Dataset(team=team, name=f"d{i}", task_kind=KIND, created_by=owner) for i in range(n)
    )
    main = Dataset.objects.create(team=team, name="main", task_kind=KIND, created_by=owner)
    versions = _versions([main], range(1, n + 1), owner)
    LabelingProject.objects.bulk_create(
        LabelingProject(
            team=team,
            source_version=versions[i],
            name=f"p{i}",
            labels=["正面", "负面"],
            status=LabelingProject.Status.READY,
            tasks_total=3,
            created_by=owner,
        )
        for i in range(n)
    )
    base_models = BaseModel.objects.bulk_create(
        BaseModel(
            team=team,
            name=f"b{i}",
            backend="paddle",
            architecture="ernie",
            summary={"layers": 2, "hidden_size": 64},
            manifest={"files": {"config.json": {"sha256": "0" * 64, "size": 10}}},
            storage_prefix=f"base/{name}/{i}/",
            created_by=owner,
        )
        for i in range(n)
    )
    jobs = TrainingJob.objects.bulk_create(
        TrainingJob(
            team=team,
            name=f"j{i}",
            dataset_version=versions[i],
            task_kind=KIND,
            labels=["正面", "负面"],
            base_model=base_models[i] if i % 2 else None,
            preset="" if i % 2 else "ernie-micro-char",
            backend="paddle",
            status=TrainingJob.Status.SUCCEEDED,
            created_by=owner,
        )
        for i in range(n)
    )
    model_versions = ModelVersion.objects.bulk_create(
        ModelVersion(
            team=team,
            name="m",
            number=i + 1,
            job=jobs[i],
            dataset_version=versions[i],
            task_kind=KIND,
            labels=["正面", "负面"],
            backend="paddle",
            runtime="paddle_inference",
            base="ernie-micro-char",
            metrics={"accuracy": 0.9, "macro_f1": 0.8},
            storage_prefix=f"models/{name}/{i}/",
            created_by=owner,
        )
        for i in range(n)
    )
    endpoints = Endpoint.objects.bulk_create(
        Endpoint(team=team, name=f"{name}-e{i}", task_kind=KIND, created_by=owner) for i in range(n)
    )
    main_endpoint = Endpoint.objects.create(
        team=team, name=f"{name}-main", task_kind=KIND, created_by=owner
    )
    revisions = Revision.objects.bulk_create(
        [
            *(
                Revision(endpoint=e, number=1, model_version=model_versions[i])
                for i, e in enumerate(endpoints)
            ),
            *(
                Revision(
                    endpoint=main_endpoint,
                    number=i + 1,
                    model_version=model_versions[i],
                    status=Revision.Status.ACTIVE if i == n - 1 else Revision.Status.RETIRED,
                )
                for i in range(n)
            ),
        ]
    )
    # The main endpoint's active revision is ready; the other revisions are not placed (a
    # query per revision for its placements would show all the same).
    Placement.objects.create(revision=revisions[-1], host=host, state=Placement.State.READY)
    EndpointKey.objects.bulk_create(
        EndpointKey(
            endpoint=main_endpoint,
            name=f"k{i}",
            prefix="mpe_x",
            key_hash=_digest(f"{name}-key-{i}"),
            rate_per_s=10 if i % 2 else None,
        )
        for i in range(n)
    )
    return Side(n, team, owner, main, main_endpoint)


@pytest.fixture(scope="module")
def sides(django_db_setup, django_db_blocker) -> Iterator[dict[str, Side]]:
    # One transaction for the module, rolled back at its end (each test's own transaction is a
    # savepoint inside it): nothing is left for the tests that follow, and nothing to delete.
    with django_db_blocker.unblock(), transaction.atomic():
        host = ServingHost.objects.create(url="http://query-counts.invalid:8300", reachable=True)
        try:
            yield {"small": fill("small", SMALL, host), "big": fill("big", BIG, host)}
        finally:
            transaction.set_rollback(True)


def count_queries(client, url: str) -> tuple[int, object]:
    client.get(url)  # a first request fills what is cached per process
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(queries), response


# (URL name, its arguments beyond the team: Side attribute → URL kwarg)
TEAM_PAGES = [
    ("console:dashboard", {}),
    ("console:members", {}),
    ("console:audit", {}),
    ("labeling:datasets", {}),
    ("labeling:dataset", {"dataset_id": "dataset"}),
    ("labeling:projects", {}),
    ("training:jobs", {}),
    ("training:models", {}),
    ("training:base_models", {}),
    ("deployment:endpoints", {}),
    ("deployment:endpoint", {"endpoint_id": "endpoint"}),
    # Forms whose choosers list a page of the 10,000 (console.pickers), not all of them.
    ("training:job_new", {}),
    ("training:sweep_new", {}),
    ("deployment:endpoint_new", {}),
]
FORMS = {"training:job_new", "training:sweep_new", "deployment:endpoint_new"}
TEAM_API_LISTS = [
    ("api:members", {}),
    ("api:audit", {}),
    ("labeling:api_datasets", {}),
    ("labeling:api_versions", {"dataset_id": "dataset"}),
    ("labeling:api_projects", {}),
    ("training:api_base_models", {}),
    ("training:api_jobs", {}),
    ("training:api_models", {}),
    ("deployment:api_endpoints", {}),
    ("deployment:api_keys", {"endpoint_id": "endpoint"}),
]


def team_url(name: str, args: dict, side: Side) -> str:
    kwargs = {key: getattr(side, attr).pk for key, attr in args.items()}
    return reverse(name, kwargs={"team": side.team.slug, **kwargs})


@pytest.mark.parametrize(("name", "args"), TEAM_PAGES, ids=[n for n, _ in TEAM_PAGES])
def test_a_team_page_needs_no_more_queries_with_10000_objects(
    db, client, sides, django_assert_max_num_queries, name, args
):
    small, big = sides["small"], sides["big"]
    client.force_login(small.owner)
    expected, _ = count_queries(client, team_url(name, args, small))
    client.force_login(big.owner)
    url = team_url(name, args, big)
    client.get(url)
    with django_assert_max_num_queries(expected):
        response = client.get(url)
    assert response.status_code == 200
    page = response.content.decode()
    if name in FORMS:
        assert page.count("<option") < 2 * PICKER_PAGE + 50, name
    elif name != "console:dashboard":  # every other page lists 10,000 of something
        assert 'data-testid="pager"' in page and 'rel="next"' in page, name


def test_the_endpoint_page_pages_its_revisions_and_keys_apart(db, client, sides):
    big = sides["big"]
    client.force_login(big.owner)
    url = team_url("deployment:endpoint", {"endpoint_id": "endpoint"}, big)
    page = client.get(url, {"revisions": 2, "keys": 3}).content.decode()
    # Each pager keeps the other's page in its links.
    assert "keys=3&amp;revisions=3" in page and "revisions=2&amp;keys=4" in page
    assert page.count("data-revision=") == 20  # a page of revisions
    assert 'data-state="ready"' in page  # the state comes from the active revision, on page 1


@pytest.mark.parametrize(("name", "args"), TEAM_API_LISTS, ids=[n for n, _ in TEAM_API_LISTS])
def test_an_api_list_needs_no_more_queries_with_10000_objects(
    db, client, sides, django_assert_max_num_queries, name, args
):
    small, big = sides["small"], sides["big"]
    client.force_login(small.owner)
    expected, response = count_queries(client, team_url(name, args, small))
    assert response.json()["count"] >= SMALL
    client.force_login(big.owner)
    url = team_url(name, args, big)
    client.get(url)
    with django_assert_max_num_queries(expected):
        response = client.get(url)
    body = response.json()
    assert body["count"] >= BIG and len(body["results"]) == PAGE_SIZE and body["next"]


def test_the_token_lists_need_no_more_queries_with_10000_tokens(
    db, client, sides, django_assert_max_num_queries
):
    for url in (reverse("console:tokens"), reverse("api:tokens")):
        client.force_login(sides["small"].owner)
        expected, _ = count_queries(client, url)
        client.force_login(sides["big"].owner)
        client.get(url)
        with django_assert_max_num_queries(expected):
            response = client.get(url)
        assert response.status_code == 200
        assert 'rel="next"' in response.content.decode() or response.json()["next"]


def add_nodes(start: int, count: int) -> None:
    nodes = Node.objects.bulk_create(
        Node(name=f"node-{i:05d}", queues=["train.cpu"]) for i in range(start, start + count)
    )
    Device.objects.bulk_create(Device(node=node, device_type="cpu", index=0) for node in nodes)


def test_the_sites_nodes_and_accounts_need_no_more_queries_with_10000_more(
    client, make_user, django_assert_max_num_queries
):
    admin = make_user("root", is_staff=True)
    client.force_login(admin)
    add_nodes(0, SMALL)
    urls = [reverse("console:nodes"), reverse("api:nodes"), reverse("console:users")]
    expected = {url: count_queries(client, url)[0] for url in urls}
    add_nodes(SMALL, BIG)
    user_model = get_user_model()
    user_model.objects.bulk_create(
        user_model(username=f"account-{i:05d}", password="!") for i in range(BIG)
    )
    for url in urls:
        client.get(url)
        with django_assert_max_num_queries(expected[url]):
            response = client.get(url)
        assert response.status_code == 200
    assert client.get(reverse("api:nodes")).json()["count"] == SMALL + BIG
    assert 'rel="next"' in client.get(reverse("console:users")).content.decode()
