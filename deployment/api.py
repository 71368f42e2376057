"""REST API of deployment, under /api/v1/teams/<team>/. Thin: services write, selectors read."""

from django.http import StreamingHttpResponse
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, OpenApiTypes, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer

from console.api import Op, TeamAPIView, created, service_call, validated
from console.pagination import PaginatedList
from console.roles import Perm
from deployment import selectors
from deployment.adapters import adapter_add, adapter_remove
from deployment.evaluations import endpoint_evaluation_start
from deployment.hosts import HostError, endpoint_chat, endpoint_predict
from deployment.keys import endpoint_key_create, endpoint_key_revoke
from deployment.metrics import metrics_collect
from deployment.preannotate import preannotate_start
from deployment.quality import compare_with_serving
from deployment.rollout import (
    endpoint_delete,
    endpoint_deploy,
    endpoint_rollback,
    revision_add,
    revision_promote,
    revision_set_weight,
)
from deployment.serializers import (
    AdapterCreateSerializer,
    AdapterSerializer,
    CanarySerializer,
    ChatSerializer,
    ComparisonSerializer,
    DeploySerializer,
    EndpointDetailSerializer,
    EndpointEvaluateSerializer,
    EndpointPromotedSerializer,
    EndpointSerializer,
    KeyCreatedSerializer,
    KeyCreateSerializer,
    KeySerializer,
    PreannotateSerializer,
    PredictSerializer,
    RevisionCreatedSerializer,
    RevisionSerializer,
    WeightSerializer,
)
from labeling.selectors import labeling_project_get
from runtime.kinds import GENERATIVE_KINDS
from training.selectors import evaluation_set_get, model_version_get
from training.serializers import ModelEvaluationSerializer


def validated_with_model_version(serializer_class: type[Serializer], request: Request) -> dict:
    """The body, its ``model_version`` (an id) replaced by that model version of the team."""
    data = validated(serializer_class, request)
    data["model_version"] = model_version_get(request.team, data["model_version"])
    return data


def endpoint_detail(endpoint) -> dict:
    revisions = list(selectors.endpoint_revisions(endpoint))
    endpoint.state = selectors.endpoint_state(endpoint, revisions)
    return EndpointDetailSerializer(endpoint, context={"revisions": revisions}).data


class DeploymentAPIView(TeamAPIView):
    write_permission = Perm.DEPLOYMENT_WRITE

    def endpoint(self):
        return selectors.endpoint_get(self.request.team, self.kwargs["endpoint_id"])


class EndpointListCreate(PaginatedList, DeploymentAPIView):
    get = Op.list(selectors.team_endpoints, EndpointSerializer)

    # Written out: the answer is the endpoint's detail, with its revisions.
    @extend_schema(request=DeploySerializer, responses={201: EndpointDetailSerializer})
    def post(self, request: Request, team: str) -> Response:
        data = validated_with_model_version(DeploySerializer, request)
        endpoint = service_call(endpoint_deploy, actor=request.user, team=request.team, **data)
        return Response(endpoint_detail(endpoint), status=status.HTTP_201_CREATED)


class EndpointDetail(DeploymentAPIView):
    @extend_schema(responses=EndpointDetailSerializer)
    def get(self, request: Request, team: str, endpoint_id: int) -> Response:
        return Response(endpoint_detail(self.endpoint()))

    delete = Op.delete(endpoint_delete, endpoint=selectors.endpoint_get)


class RevisionCreate(DeploymentAPIView):
    # The answer has the canary beside the serving version: a worse one is warned, not refused.
    @extend_schema(request=CanarySerializer, responses={201: RevisionCreatedSerializer})
    def post(self, request: Request, team: str, endpoint_id: int) -> Response:
        endpoint = self.endpoint()
        data = validated_with_model_version(CanarySerializer, request)
        revision = service_call(revision_add, actor=request.user, endpoint=endpoint, **data)
        return created(RevisionCreatedSerializer, revision)


class EndpointCompare(DeploymentAPIView):
    """A model version of the team beside the one the endpoint serves, before a canary."""

    @extend_schema(
        parameters=[OpenApiParameter("model_version", int, required=True)],
        responses=ComparisonSerializer,
    )
    def get(self, request: Request, team: str, endpoint_id: int) -> Response:
        endpoint = self.endpoint()
        version_id = request.query_params.get("model_version", "")
        if not version_id.isdigit():
            raise ValidationError({"model_version": _("A model version's id is required.")})
        version = model_version_get(request.team, int(version_id))
        return Response({"comparison": compare_with_serving(endpoint, version)})


class RevisionDetail(DeploymentAPIView):
    def parent(self):
        return self.endpoint()

    get = Op.retrieve(selectors.revision_get, RevisionSerializer)
    patch = Op.update(
        revision_set_weight,
        revision=selectors.revision_get,
        body=WeightSerializer,
        answer=RevisionSerializer,
    )


class RevisionPromote(DeploymentAPIView):
    @extend_schema(request=None, responses=EndpointPromotedSerializer)
    def post(self, request: Request, team: str, endpoint_id: int, revision_id: int) -> Response:
        revision = selectors.revision_get(self.endpoint(), revision_id)
        promoted = service_call(revision_promote, actor=request.user, revision=revision)
        return Response({**endpoint_detail(self.endpoint()), "comparison": promoted.comparison})


class EndpointRollback(DeploymentAPIView):
    @extend_schema(request=None, responses=EndpointDetailSerializer)
    def post(self, request: Request, team: str, endpoint_id: int) -> Response:
        endpoint = self.endpoint()
        service_call(endpoint_rollback, actor=request.user, endpoint=endpoint)
        return Response(endpoint_detail(self.endpoint()))


class KeyListCreate(PaginatedList, DeploymentAPIView):
    def parent(self):
        return self.endpoint()

    get = Op.list(selectors.endpoint_keys, KeySerializer)

    # Written out: the plain key is in this answer only.
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


class AdapterListCreate(PaginatedList, DeploymentAPIView):
    """The LoRA adapters the endpoint serves over its model (``model="<endpoint>/<name>"``)."""

    def parent(self):
        return self.endpoint()

    get = Op.list(selectors.endpoint_adapters, AdapterSerializer)

    @extend_schema(request=AdapterCreateSerializer, responses={201: AdapterSerializer})
    def post(self, request: Request, team: str, endpoint_id: int) -> Response:
        endpoint = self.endpoint()
        data = validated_with_model_version(AdapterCreateSerializer, request)
        adapter = service_call(adapter_add, actor=request.user, endpoint=endpoint, **data)
        return created(AdapterSerializer, adapter)


class AdapterDetail(DeploymentAPIView):
    def parent(self):
        return self.endpoint()

    get = Op.retrieve(selectors.endpoint_adapter_get, AdapterSerializer)
    delete = Op.delete(adapter_remove, adapter=selectors.endpoint_adapter_get)


class EndpointEvaluations(PaginatedList, DeploymentAPIView):
    """The endpoint's scores on evaluation sets; POST queues one (``deployment.evaluations``):
    the endpoint, or one of its adapters, called on every question through its API."""

    write_permission = Perm.TRAINING_WRITE

    def parent(self):
        return self.endpoint()

    get = Op.list(selectors.endpoint_evaluations, ModelEvaluationSerializer)

    @extend_schema(request=EndpointEvaluateSerializer, responses={201: ModelEvaluationSerializer})
    def post(self, request: Request, team: str, endpoint_id: int) -> Response:
        endpoint = self.endpoint()
        data = validated(EndpointEvaluateSerializer, request)
        evaluation = service_call(
            endpoint_evaluation_start,
            actor=request.user,
            team=request.team,
            endpoint=endpoint,
            dataset_version=evaluation_set_get(request.team, data["evaluation_set"]),
            adapter=data["adapter"],
            max_new_tokens=data["max_new_tokens"],
        )
        return created(ModelEvaluationSerializer, evaluation)


class KeyRevoke(DeploymentAPIView):
    def parent(self):
        return self.endpoint()

    post = Op.action(endpoint_key_revoke, key=selectors.endpoint_key_get, answer=KeySerializer)


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
