"""REST API of training, under /api/v1/teams/<team>/. Thin: base_models, jobs and registry
write, selectors read."""

import tempfile

from django.http import FileResponse, Http404
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import Op, TeamAPIView, created, service_call, validated
from console.pagination import PaginatedList
from console.roles import Perm
from labeling.selectors import dataset_get, version_get
from runtime.presets import FAST_PRESETS, LLM_PRESETS, PRESETS, is_fast, preset_config
from training import base_models, compression, evaluations, jobs, registry, selectors, sweeps
from training.edge import NEEDS as EDGE_RUNTIMES
from training.edge import edge_bundle
from training.serializers import (
    BaseModelFromVersionSerializer,
    BaseModelImportSerializer,
    BaseModelSerializer,
    BaseModelShareSerializer,
    CompressSerializer,
    EvaluateSerializer,
    JobCloneSerializer,
    JobEventsSerializer,
    JobSerializer,
    JobSubmitSerializer,
    LeaderboardSerializer,
    ModelEvaluationSerializer,
    ModelImportSerializer,
    ModelVersionDetailSerializer,
    ModelVersionSerializer,
    PresetSerializer,
    SweepCreateSerializer,
    SweepDetailSerializer,
    SweepSerializer,
)


def model_archive_response(version, target: str | None = None, edge=False) -> FileResponse:
    """The version as one .tar.gz (spooled to disk: models are large), only its export
    target ``target`` (``?target=onnx``), or that target's edge bundle (``&bundle=edge``):
    404 for a target it does not have."""
    out = tempfile.TemporaryFile()
    if not target:
        registry.model_version_archive(version, out)
        name = f"{version.name}-v{version.number}.tar.gz"
    elif edge and edge_bundle(version, target, out):
        name = f"{version.name}-v{version.number}-{target}-edge.tar.gz"
    elif not edge and registry.model_version_target_archive(version, target, out):
        name = f"{version.name}-v{version.number}-{target}.tar.gz"
    else:
        out.close()
        ready = {t["name"]: t for t in registry.model_version_targets(version)}
        if edge and target in ready and ready[target]["status"] == "ready":
            raise Http404(
                _("The %(t)s target has no edge bundle: edge bundles run on %(all)s.")
                % {"t": target, "all": ", ".join(EDGE_RUNTIMES)}
            )
        raise Http404(_("This model version has no target %(t)s.") % {"t": target})
    out.seek(0)
    return FileResponse(out, as_attachment=True, filename=name)


def create_on_version(request: Request, body, service, answer) -> Response:
    """A create whose ``body`` names a dataset version (``dataset_id``, ``dataset_version``),
    found in the team first: ``service`` gets it with the rest of the body."""
    data = validated(body, request)
    dataset = dataset_get(request.team, data.pop("dataset_id"))
    version = version_get(dataset, data.pop("dataset_version"))
    made = service_call(
        service, actor=request.user, team=request.team, dataset_version=version, **data
    )
    return created(answer, made)


class TrainingAPIView(TeamAPIView):
    write_permission = Perm.TRAINING_WRITE

    def job(self):
        return selectors.job_get(self.request.team, self.kwargs["training_job_id"])


class PresetList(TrainingAPIView):
    @extend_schema(responses=PresetSerializer(many=True))
    def get(self, request: Request, team: str) -> Response:
        def row(name: str, generative: bool = False) -> dict:
            kinds = FAST_PRESETS[name]["kinds"] if is_fast(name) else None
            config = LLM_PRESETS[name] if generative else preset_config(name)
            return {"name": name, "config": config, "generative": generative, "kinds": kinds}

        return Response(
            [row(n) for n in (*FAST_PRESETS, *PRESETS)] + [row(n, True) for n in LLM_PRESETS]
        )


class BaseModelListCreate(PaginatedList, TrainingAPIView):
    write_permission = Perm.MODEL_IMPORT
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    get = Op.list(selectors.team_base_models, BaseModelSerializer)
    post = Op.create(
        base_models.base_model_import, body=BaseModelImportSerializer, answer=BaseModelSerializer
    )


class BaseModelDetail(TrainingAPIView):
    write_permission = Perm.MODEL_IMPORT

    get = Op.retrieve(selectors.base_model_get, BaseModelSerializer)
    patch = Op.update(
        base_models.base_model_set_shared,
        with_team=True,
        model=selectors.base_model_get,
        body=BaseModelShareSerializer,
        answer=BaseModelSerializer,
        doc="Site staff: share the model with every team of the site, or take it back.",
    )


class JobListCreate(PaginatedList, TrainingAPIView):
    get = Op.list(selectors.team_jobs, JobSerializer)

    # Written out: the body names a dataset version, found in the team first.
    @extend_schema(request=JobSubmitSerializer, responses={201: JobSerializer})
    def post(self, request: Request, team: str) -> Response:
        return create_on_version(
            request, JobSubmitSerializer, jobs.training_job_submit, JobSerializer
        )


class JobDetail(TrainingAPIView):
    get = Op.retrieve(selectors.job_get, JobSerializer)


class JobEvents(TrainingAPIView):
    @extend_schema(
        parameters=[OpenApiParameter("after", int, description="Events after this id.")],
        responses=JobEventsSerializer,
    )
    def get(self, request: Request, team: str, training_job_id: int) -> Response:
        job = self.job()
        try:
            after = int(request.query_params.get("after", 0))
        except ValueError:
            after = 0
        events = selectors.job_events(job, after)
        return Response(JobEventsSerializer({"job": job, "events": events}).data)


class JobCancel(TrainingAPIView):
    post = Op.action(jobs.training_job_cancel, job=selectors.job_get, answer=JobSerializer)


class JobRetry(TrainingAPIView):
    post = Op.action(
        jobs.training_job_retry, job=selectors.job_get, answer=JobSerializer, status_code=201
    )


class JobClone(TrainingAPIView):
    @extend_schema(request=JobCloneSerializer, responses={201: JobSerializer})
    def post(self, request: Request, team: str, training_job_id: int) -> Response:
        data = validated(JobCloneSerializer, request)
        job = service_call(
            jobs.training_job_clone,
            actor=request.user,
            job=self.job(),
            changes=data,
        )
        return created(JobSerializer, job)


class ModelVersionList(PaginatedList, TrainingAPIView):
    parser_classes = [MultiPartParser, FormParser]

    get = Op.list(selectors.team_model_versions, ModelVersionSerializer)
    post = Op.create(
        registry.model_version_import,
        body=ModelImportSerializer,
        answer=ModelVersionSerializer,
        doc="Import a model version from another site's archive (its download).",
    )


class ModelVersionDetail(TrainingAPIView):
    get = Op.retrieve(selectors.model_version_get, ModelVersionDetailSerializer)
    delete = Op.delete(registry.model_version_delete, version=selectors.model_version_get)


class ModelVersionBaseModel(TrainingAPIView):
    """A fine-tuned large model as a base model of the team, for further jobs."""

    write_permission = Perm.MODEL_IMPORT

    post = Op.action(
        base_models.base_model_from_version,
        version=selectors.model_version_get,
        body=BaseModelFromVersionSerializer,
        answer=BaseModelSerializer,
        status_code=201,
    )


class ModelVersionCompress(TrainingAPIView):
    """Queue the version's INT8 compression: the job, whose result is a new version."""

    post = Op.action(
        compression.compression_submit,
        version=selectors.model_version_get,
        body=CompressSerializer,
        answer=JobSerializer,
        status_code=201,
    )


class ModelVersionEvaluations(PaginatedList, TrainingAPIView):
    """The version's scores on evaluation sets; POST queues an evaluate job."""

    def parent(self):
        return selectors.model_version_get(self.request.team, self.kwargs["model_version_id"])

    get = Op.list(selectors.version_evaluations, ModelEvaluationSerializer)

    @extend_schema(request=EvaluateSerializer, responses={201: JobSerializer})
    def post(self, request: Request, team: str, model_version_id: int) -> Response:
        version = self.parent()
        data = validated(EvaluateSerializer, request)
        job = service_call(
            evaluations.evaluation_submit,
            actor=request.user,
            team=request.team,
            model_version=version,
            dataset_version=selectors.evaluation_set_get(request.team, data["evaluation_set"]),
            max_new_tokens=data["max_new_tokens"],
        )
        return created(JobSerializer, job)


class Leaderboard(TrainingAPIView):
    """Every model version scored on an evaluation set, best first (the latest score of each)."""

    @extend_schema(responses=LeaderboardSerializer)
    def get(self, request: Request, team: str, dataset_version_id: int) -> Response:
        board = evaluations.leaderboard(
            selectors.evaluation_set_get(request.team, dataset_version_id)
        )
        return Response(LeaderboardSerializer(board).data)


class ModelVersionDownload(TrainingAPIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "target",
                str,
                description="one export target (paddle_inference, onnx) instead of everything",
            ),
            OpenApiParameter(
                "bundle",
                str,
                enum=["edge"],
                description="with target: its edge bundle (the target, a standalone predictor, "
                "examples and their expected outputs)",
            ),
        ],
        responses={(200, "application/gzip"): bytes},
    )
    def get(self, request: Request, team: str, model_version_id: int) -> FileResponse:
        version = selectors.model_version_get(request.team, model_version_id)
        edge = request.query_params.get("bundle") == "edge"
        return model_archive_response(version, request.query_params.get("target"), edge)


class SweepListCreate(PaginatedList, TrainingAPIView):
    get = Op.list(selectors.team_sweeps, SweepSerializer)

    # Written out: the body names a dataset version, found in the team first.
    @extend_schema(request=SweepCreateSerializer, responses={201: SweepDetailSerializer})
    def post(self, request: Request, team: str) -> Response:
        return create_on_version(
            request, SweepCreateSerializer, sweeps.sweep_create, SweepDetailSerializer
        )


class SweepDetail(TrainingAPIView):
    get = Op.retrieve(selectors.sweep_get, SweepDetailSerializer)


class SweepCancel(TrainingAPIView):
    post = Op.action(sweeps.sweep_cancel, sweep=selectors.sweep_get, answer=SweepDetailSerializer)
