"""REST API of training, under /api/v1/teams/<team>/. Thin: base_models, jobs and registry
write, selectors read."""

import tempfile

from django.http import FileResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import TeamAPIView, created, service_call, validated
from console.pagination import PaginatedList
from console.roles import Perm
from labeling.selectors import dataset_get, version_get
from runtime.presets import LLM_PRESETS, PRESETS
from training import base_models, jobs, registry, selectors
from training.serializers import (
    BaseModelFromVersionSerializer,
    BaseModelImportSerializer,
    BaseModelSerializer,
    BaseModelShareSerializer,
    JobCloneSerializer,
    JobEventsSerializer,
    JobSerializer,
    JobSubmitSerializer,
    ModelImportSerializer,
    ModelVersionDetailSerializer,
    ModelVersionSerializer,
    PresetSerializer,
)


class TrainingAPIView(TeamAPIView):
    write_permission = Perm.TRAINING_WRITE

    def job(self):
        return selectors.job_get(self.request.team, self.kwargs["training_job_id"])


class PresetList(TrainingAPIView):
    @extend_schema(responses=PresetSerializer(many=True))
    def get(self, request: Request, team: str) -> Response:
        return Response(
            [{"name": n, "config": c, "generative": False} for n, c in PRESETS.items()]
            + [{"name": n, "config": c, "generative": True} for n, c in LLM_PRESETS.items()]
        )


class BaseModelListCreate(PaginatedList, TrainingAPIView):
    write_permission = Perm.MODEL_IMPORT
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    @extend_schema(responses=BaseModelSerializer(many=True))
    def get(self, request: Request, team: str) -> Response:
        models = selectors.team_base_models(request.team)
        return self.paginated(request, models, BaseModelSerializer)

    @extend_schema(request=BaseModelImportSerializer, responses={201: BaseModelSerializer})
    def post(self, request: Request, team: str) -> Response:
        data = validated(BaseModelImportSerializer, request)
        model = service_call(
            base_models.base_model_import,
            actor=request.user,
            team=request.team,
            **data,
        )
        return created(BaseModelSerializer, model)


class BaseModelDetail(TrainingAPIView):
    write_permission = Perm.MODEL_IMPORT

    @extend_schema(responses=BaseModelSerializer)
    def get(self, request: Request, team: str, base_model_id: int) -> Response:
        model = selectors.base_model_get(request.team, base_model_id)
        return Response(BaseModelSerializer(model).data)

    @extend_schema(request=BaseModelShareSerializer, responses=BaseModelSerializer)
    def patch(self, request: Request, team: str, base_model_id: int) -> Response:
        """Site staff: share the model with every team of the site, or take it back."""
        model = selectors.base_model_get(request.team, base_model_id)
        data = validated(BaseModelShareSerializer, request)
        model = service_call(
            base_models.base_model_set_shared,
            actor=request.user,
            team=request.team,
            model=model,
            shared=data["shared"],
        )
        return Response(BaseModelSerializer(model).data)


class JobListCreate(PaginatedList, TrainingAPIView):
    @extend_schema(responses=JobSerializer(many=True))
    def get(self, request: Request, team: str) -> Response:
        return self.paginated(request, selectors.team_jobs(request.team), JobSerializer)

    @extend_schema(request=JobSubmitSerializer, responses={201: JobSerializer})
    def post(self, request: Request, team: str) -> Response:
        data = validated(JobSubmitSerializer, request)
        dataset = dataset_get(request.team, data.pop("dataset_id"))
        version = version_get(dataset, data.pop("dataset_version"))
        job = service_call(
            jobs.training_job_submit,
            actor=request.user,
            team=request.team,
            dataset_version=version,
            **data,
        )
        return created(JobSerializer, job)


class JobDetail(TrainingAPIView):
    @extend_schema(responses=JobSerializer)
    def get(self, request: Request, team: str, training_job_id: int) -> Response:
        return Response(JobSerializer(self.job()).data)


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
    @extend_schema(request=None, responses=JobSerializer)
    def post(self, request: Request, team: str, training_job_id: int) -> Response:
        job = service_call(jobs.training_job_cancel, actor=request.user, job=self.job())
        return Response(JobSerializer(job).data)


class JobRetry(TrainingAPIView):
    @extend_schema(request=None, responses={201: JobSerializer})
    def post(self, request: Request, team: str, training_job_id: int) -> Response:
        job = service_call(jobs.training_job_retry, actor=request.user, job=self.job())
        return created(JobSerializer, job)


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

    @extend_schema(responses=ModelVersionSerializer(many=True))
    def get(self, request: Request, team: str) -> Response:
        versions = selectors.team_model_versions(request.team)
        return self.paginated(request, versions, ModelVersionSerializer)

    @extend_schema(request=ModelImportSerializer, responses={201: ModelVersionSerializer})
    def post(self, request: Request, team: str) -> Response:
        """Import a model version from another site's archive (its download)."""
        data = validated(ModelImportSerializer, request)
        version = service_call(
            registry.model_version_import,
            actor=request.user,
            team=request.team,
            archive=data["archive"],
        )
        return created(ModelVersionSerializer, version)


class ModelVersionDetail(TrainingAPIView):
    @extend_schema(responses=ModelVersionDetailSerializer)
    def get(self, request: Request, team: str, model_version_id: int) -> Response:
        version = selectors.model_version_get(request.team, model_version_id)
        return Response(ModelVersionDetailSerializer(version).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, team: str, model_version_id: int) -> Response:
        version = selectors.model_version_get(request.team, model_version_id)
        service_call(registry.model_version_delete, actor=request.user, version=version)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelVersionBaseModel(TrainingAPIView):
    """A fine-tuned large model as a base model of the team, for further jobs."""

    write_permission = Perm.MODEL_IMPORT

    @extend_schema(request=BaseModelFromVersionSerializer, responses={201: BaseModelSerializer})
    def post(self, request: Request, team: str, model_version_id: int) -> Response:
        version = selectors.model_version_get(request.team, model_version_id)
        data = validated(BaseModelFromVersionSerializer, request)
        model = service_call(
            base_models.base_model_from_version,
            actor=request.user,
            version=version,
            name=data["name"],
        )
        return created(BaseModelSerializer, model)


class ModelVersionDownload(TrainingAPIView):
    @extend_schema(responses={(200, "application/gzip"): bytes})
    def get(self, request: Request, team: str, model_version_id: int) -> FileResponse:
        version = selectors.model_version_get(request.team, model_version_id)
        return model_archive_response(version)


def model_archive_response(version) -> FileResponse:
    """The version as one .tar.gz (spooled to disk: models are large)."""
    out = tempfile.TemporaryFile()
    registry.model_version_archive(version, out)
    out.seek(0)
    return FileResponse(
        out, as_attachment=True, filename=f"{version.name}-v{version.number}.tar.gz"
    )
