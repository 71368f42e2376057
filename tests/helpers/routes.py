"""The URLconf's named routes, and how to make in a team the object each URL argument names
(for the tests that visit every route)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tests.helpers.data import make_version


@dataclass(frozen=True)
class Route:
    name: str
    kwargs: tuple[str, ...]
    path: str

    @property
    def team_scoped(self) -> bool:
        return "team" in self.kwargs

    @property
    def is_api(self) -> bool:
        return self.path.startswith("api/")


def iter_routes(
    patterns=None, namespace: str = "", kwargs: tuple = (), prefix: str = ""
) -> Iterator[Route]:
    from django.urls import URLPattern, URLResolver, get_resolver

    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        names = kwargs + tuple(entry.pattern.converters)
        path = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            ns = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from iter_routes(entry.url_patterns, ns, names, path)
        elif isinstance(entry, URLPattern) and entry.name:
            yield Route(f"{namespace}{entry.name}", names, path)


def routes() -> list[Route]:
    """Every named route of the URLconf, by name."""
    return sorted(set(iter_routes()), key=lambda r: r.name)


def object_factories(team, owner) -> dict:
    """How to make, in `team`, the object that each URL argument names."""
    from console import services
    from console.models import Membership, NotificationChannel
    from labeling.datasets import dataset_create, upload_create
    from labeling.projects import labeling_project_create
    from training.jobs import training_job_submit
    from training.models import BaseModel, ModelVersion, Sweep

    def version():
        dataset = dataset_create(
            actor=owner, team=team, name="评论", task_kind="text_classification"
        )
        return make_version(dataset, owner)

    v = version()
    job = training_job_submit(actor=owner, team=team, dataset_version=v)
    base = BaseModel.objects.create(
        team=team, name="基座", backend="paddle", architecture="ernie", storage_prefix="x/"
    )
    model_version = ModelVersion.objects.create(
        team=team,
        name="评论",
        number=1,
        job=job,
        dataset_version=v,
        task_kind="text_classification",
        backend="paddle",
        runtime="paddle_inference",
        storage_prefix="y/",
    )
    sweep = Sweep.objects.create(
        team=team, name="s", dataset_version=v, backend="paddle", n_trials=2, created_by=owner
    )
    upload = upload_create(actor=owner, team=team, filename="x.csv", size=10)
    from deployment.models import Endpoint, EndpointAdapter, EndpointKey, Revision

    endpoint = Endpoint.objects.create(
        team=team, name=f"ep-{team.slug}", task_kind="text_classification"
    )
    revision = Revision.objects.create(endpoint=endpoint, number=1, model_version=model_version)
    endpoint_key = EndpointKey.objects.create(
        endpoint=endpoint, name="k", prefix="mpe_x", key_hash=f"hash-{team.slug}"
    )
    adapter = EndpointAdapter.objects.create(
        endpoint=endpoint, name="a", model_version=model_version
    )
    from training.models import ModelEvaluation

    evaluation_set = make_version(
        dataset_create(actor=owner, team=team, name="考试", task_kind="evaluation"),
        owner,
        [["question", "A", "B", "C", "D", "answer"], ["1+1?", "1", "2", "3", "4", "B"]],
    )
    evaluation = ModelEvaluation.objects.create(
        team=team, model_version=model_version, dataset_version=evaluation_set
    )
    return {
        "team": lambda: team.slug,
        "membership_id": lambda: Membership.objects.filter(team=team).first().pk,
        "token_id": lambda: services.api_token_create(actor=owner, name="t")[0].pk,
        "dataset_id": lambda: v.dataset_id,
        "number": lambda: v.number,
        "job_id": lambda: v.lineage["import_job"],
        "upload_id": lambda: upload.pk,
        "kind": lambda: "original",
        "user_id": lambda: owner.pk,
        "project_id": lambda: labeling_project_create(actor=owner, version=v, name="p").pk,
        "training_job_id": lambda: job.pk,
        "base_model_id": lambda: base.pk,
        "model_version_id": lambda: model_version.pk,
        "sweep_id": lambda: sweep.pk,
        "endpoint_id": lambda: endpoint.pk,
        "revision_id": lambda: revision.pk,
        "endpoint_key_id": lambda: endpoint_key.pk,
        "adapter_id": lambda: adapter.pk,
        "dataset_version_id": lambda: evaluation_set.pk,
        "evaluation_id": lambda: evaluation.pk,
        "channel_id": lambda: (
            NotificationChannel.objects.create(
                team=team, name="c", kind="email", target="a@example.com", events=["job_failed"]
            ).pk
        ),
    }
