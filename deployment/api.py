"""REST API of deployment, under /api/v1/teams/<team>/. Thin: services write, selectors read."""

from django.http import StreamingHttpResponse
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, OpenApiTypes, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import TeamAPIView, created, service_call, validated
from console.pagination import PaginatedList
from console.roles import Perm
from deployment import selectors
from deployment.hosts import HostError, endpoint_chat, endpoint_predict
from deployment.keys import endpoint_key_create, endpoint_key_revoke
from deployment.metrics import metrics_collect
from deployment.preannotate import preannotate_start
from deployment.rollout import (
    endpoint_delete,
    endpoint_deploy,
    endpoint_rollback,
    revision_add,
    revision_promote,
    revision_set_weight,
)
from deployment.serializers import (
    CanarySerializer,
    ChatSerializer,
    DeploySerializer,
    EndpointDetailSerializer,
    EndpointSerializer,
    KeyCreatedSerializer,
    KeyCreateSerializer,
    KeySerializer,
    PreannotateSerializer,
    PredictSerializer,
    RevisionSerializer,
    WeightSerializer,
)
from labeling.selectors import labeling_project_get
from runtime.kinds import GENERATIVE_KINDS
from training.selectors import model_version_get


class DeploymentAPIView(TeamAPIView):
    write_permission = Perm.DEPLOYMENT_WRITE

    def endpoint(self):
        return selectors.endpoint_get(self.request.team, self.kwargs["endpoint_id"])

    def revision(self):
        return selectors.revision_get(self.endpoint(), self.kwargs["revision_id"])


def endpoint_detail(endpoint) -> dict:
    revisions = list(selectors.endpoint_revisions(endpoint))
    endpoint.state = selectors.endpoint_state(endpoint, revisions)
    return EndpointDetailSerializer(endpoint, context={"revisions": revisions}).data


class EndpointListCreate(PaginatedList, DeploymentAPIView):
    @extend_schema(responses=EndpointSerializer(many=True))
    def get(self, request: Request, team: str) -> Response:
        endpoints = selectors.team_endpoints(request.team)
        return self.paginated(request, endpoints, EndpointSerializer)

    @extend_schema(request=DeploySerializer, responses={201: EndpointDetailSerializer})
    def post(self, request: Request, team: str) -> Response:
        data = validated(DeploySerializer, request)
        version = model_version_get(request.team, data.pop("model_version"))
        endpoint = service_call(
            endpoint_deploy,
            actor=request.user,
            team=request.team,
            model_version=version,
            **data,
        )
        return Response(endpoint_detail(endpoint), status=status.HTTP_201_CREATED)


class EndpointDetail(DeploymentAPIView):
    @extend_schema(responses=EndpointDetailSerializer)
    def get(self, request: Request, team: str, endpoint_id: int) -> Response:
        return Response(endpoint_detail(self.endpoint()))

    def delete(self, request: Request, team: str, endpoint_id: int) -> Response:
        service_call(endpoint_delete, actor=request.user, endpoint=self.endpoint())
        return Response(status=status.HTTP_204_NO_CONTENT)


class RevisionCreate(DeploymentAPIView):
    @extend_schema(request=CanarySerializer, responses={201: RevisionSerializer})
    def post(self, request: Request, team: str, endpoint_id: int) -> Response:
        endpoint = self.endpoint()
        data = validated(CanarySerializer, request)
        version = model_version_get(request.team, data.pop("model_version"))
        revision = service_call(
            revision_add,
            actor=request.user,
            endpoint=endpoint,
            model_version=version,
            **data,
        )
        return created(RevisionSerializer, revision)


class RevisionDetail(DeploymentAPIView):
    @extend_schema(responses=RevisionSerializer)
    def get(self, request: Request, team: str, endpoint_id: int, revision_id: int) -> Response:
        return Response(RevisionSerializer(self.revision()).data)

    @extend_schema(request=WeightSerializer, responses=RevisionSerializer)
    def patch(self, request: Request, team: str, endpoint_id: int, revision_id: int) -> Response:
        revision = self.revision()
        data = validated(WeightSerializer, request)
        revision = service_call(
            revision_set_weight,
            actor=request.user,
            revision=revision,
            weight=data["weight"],
        )
        return Response(RevisionSerializer(revision).data)


class RevisionPromote(DeploymentAPIView):
    @extend_schema(request=None, responses=EndpointDetailSerializer)
    def post(self, request: Request, team: str, endpoint_id: int, revision_id: int) -> Response:
        revision = self.revision()
        service_call(revision_promote, actor=request.user, revision=revision)
        return Response(endpoint_detail(self.endpoint()))


class EndpointRollback(DeploymentAPIView):
    @extend_schema(request=None, responses=EndpointDetailSerializer)
    def post(self, request: Request, team: str, endpoint_id: int) -> Response:
        endpoint = self.endpoint()
        service_call(endpoint_rollback, actor=request.user, endpoint=endpoint)
        return Response(endpoint_detail(self.endpoint()))


class KeyListCreate(PaginatedList, DeploymentAPIView):
    @extend_schema(responses=KeySerializer(many=True))
    def get(self, request: Request, team: str, endpoint_id: int) -> Response:
        keys = selectors.endpoint_keys(self.endpoint())
        return self.paginated(request, keys, KeySerializer)

    @extend_schema(request=KeyCreateSerializer, responses={201: KeyCreatedSerializer})
    def post(self, request: Request, team: str, endpoint_id: int) -> Response:
        endpoint = self.endpoint()
        data = validated(KeyCreateSerializer, request)
        key, plain = service_call(
            endpoint_key_create,
            actor=request.user,
            endpoint=endpoint,
            **data,
        )
        key.key = plain
        return created(KeyCreatedSerializer, key)


class KeyRevoke(DeploymentAPIView):
    @extend_schema(request=None, responses=KeySerializer)
    def post(self, request: Request, team: str, endpoint_id: int, endpoint_key_id: int):
        key = selectors.endpoint_key_get(self.endpoint(), endpoint_key_id)
        key = service_call(endpoint_key_revoke, actor=request.user, key=key)
        return Response(KeySerializer(key).data)


class EndpointMetrics(DeploymentAPIView):
    @extend_schema(
        parameters=[OpenApiParameter("minutes", int, description="the window, 1 to 1440")],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request, team: str, endpoint_id: int) -> Response:
        endpoint = self.endpoint()
        minutes = request.query_params.get("minutes", "60")
        minutes = min(1440, max(1, int(minutes))) if minutes.isdigit() else 60
        # Charts are fresh: scrape the hosts unless that was done in the last seconds.
        metrics_collect(max_age_s=2.0)
        return Response(selectors.endpoint_metrics(endpoint, minutes=minutes))


class EndpointPredict(DeploymentAPIView):
    """Call the endpoint as the console does (try-it): the serving host's answer as it is."""

    @extend_schema(
        request=PredictSerializer,
        responses={
            200: OpenApiTypes.OBJECT,
            (422, "application/json"): OpenApiResponse(
                OpenApiTypes.OBJECT, description="An input the model cannot take, and why."
            ),
            (503, "application/json"): OpenApiResponse(
                OpenApiTypes.OBJECT,
                description="The serving host is unreachable, or no revision is ready yet.",
            ),
        },
    )
    def post(self, request: Request, team: str, endpoint_id: int) -> Response:
        endpoint = self.endpoint()
        data = validated(PredictSerializer, request)
        try:
            code, body = endpoint_predict(endpoint=endpoint, **data)
        except HostError as exc:
            code, body = 503, {"error": {"code": "unreachable", "message": str(exc)}}
        return Response(body, status=code)


class EndpointChat(DeploymentAPIView):
    """Chat with a generative endpoint as the console's playground does: the serving host's
    server-sent events (OpenAI's chat.completion.chunk), streamed as they come."""

    @extend_schema(request=ChatSerializer, responses={(200, "text/event-stream"): OpenApiTypes.STR})
    def post(self, request: Request, team: str, endpoint_id: int) -> StreamingHttpResponse:
        endpoint = self.endpoint()
        data = validated(ChatSerializer, request)
        if endpoint.task_kind not in GENERATIVE_KINDS:
            raise ValidationError(
                {"detail": _("%(name)s is not a generative model.") % {"name": endpoint.name}}
            )
        response = StreamingHttpResponse(
            endpoint_chat(endpoint=endpoint, body=data),
            content_type="text/event-stream",
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass events on at once
        return response


class Preannotate(DeploymentAPIView):
    write_permission = Perm.LABELING_MANAGE

    @extend_schema(request=PreannotateSerializer, responses={202: None})
    def post(self, request: Request, team: str, project_id: int) -> Response:
        project = labeling_project_get(request.team, project_id)
        data = validated(PreannotateSerializer, request)
        endpoint = selectors.endpoint_get(request.team, data["endpoint"])
        service_call(preannotate_start, actor=request.user, project=project, endpoint=endpoint)
        return Response(status=status.HTTP_202_ACCEPTED)
