"""REST API of the platform core, under /api/v1/. Views are thin: services write, selectors read."""

import datetime
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import APIException, NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from console import health, lockout, quotas, selectors, services, usage
from console.forms import AuditFilterForm
from console.models import ApiToken, Membership, Team
from console.pagination import PaginatedList
from console.permissions import StaffOnly, TeamPermission
from console.roles import Perm
from console.serializers import (
    AccountActiveSerializer,
    ApiTokenSerializer,
    AuditEventSerializer,
    HealthCheckSerializer,
    InviteSerializer,
    LockoutSerializer,
    MembershipSerializer,
    NewApiTokenSerializer,
    NodeSerializer,
    RoleSerializer,
    TeamQuotasSerializer,
    TeamSerializer,
    UsageQuerySerializer,
    UserSerializer,
)


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = _(
        "Another request changed the same objects at the same moment; nothing was changed. "
        "Reload and try again."
    )
    default_code = "conflict"


def service_call(fn, **kwargs):
    """Call a service; its ValidationError becomes a 400 with the messages (apps' APIs too),
    and a uniqueness or reference that a concurrent request broke between the service's check
    and its write (the database refused it: the service's transaction rolled back) a 409."""
    try:
        return fn(**kwargs)
    except DjangoValidationError as exc:
        raise ValidationError({"detail": exc.messages}) from exc
    except IntegrityError as exc:
        if not _is_unique_violation(exc):
            raise  # a bug, not a race: a 500, with its traceback in the log
        raise Conflict() from exc


def _is_unique_violation(exc: IntegrityError) -> bool:
    # PostgreSQL's SQLSTATE 23505 (psycopg), SQLite's message.
    return getattr(exc.__cause__, "sqlstate", None) == "23505" or "UNIQUE constraint" in str(exc)


def validated(serializer_class: type[Serializer], request: Request) -> dict:
    """The request's body as ``serializer_class`` validates it (a 400 with its errors if not)."""
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def created(serializer_class: type[Serializer], instance: object) -> Response:
    """A 201 answering ``instance`` through ``serializer_class``."""
    return Response(serializer_class(instance).data, status=status.HTTP_201_CREATED)


# A view of the API under /teams/<team>/ (every app's): TeamPermission finds the team
# (request.team, request.membership) and checks the caller's role against the view's
# read_permission and write_permission. (A comment, not a docstring: drf-spectacular would
# describe every operation of every subclass with it.)
class TeamAPIView(APIView):
    permission_classes = [TeamPermission]

    def parent(self) -> Any:
        # What the selectors of the operations below take first: the team, or the object that
        # a nested URL names (an endpoint's revisions, a dataset's versions).
        return self.request.team


# -- The usual operations, declared -----------------------------------------------------------
# A method of a TeamAPIView may be one of Op's instead of a body: it names the selector that
# reads and the service that writes, and the serializers of the body and of the answer, e.g.
#     get = Op.list(selectors.team_datasets_overview, DatasetSerializer)
#     post = Op.create(dataset_create, body=DatasetCreateSerializer, answer=DatasetSerializer)
#     delete = Op.delete(dataset_delete, dataset=selectors.dataset_get)
# The view's read_permission and write_permission guard it as they guard a written-out method,
# and the schema describes it as @extend_schema would one (``doc`` is its docstring). An
# operation with logic of its own is written out.

Selector = Callable[..., Any]
Service = Callable[..., Any]
Handler = Callable[..., Response]


def _url_object(view: TeamAPIView, selector: Selector) -> Any:
    # The object the URL names: the selector takes the view's parent and the URL's last argument.
    return selector(view.parent(), list(view.kwargs.values())[-1])


def _target(target: dict[str, Selector]) -> tuple[str, Selector]:
    # `name=selector`: the keyword the service takes the URL's object as, and its selector.
    if len(target) != 1:
        raise TypeError(f"name the one object the service takes, not {sorted(target)}")
    return next(iter(target.items()))


def _on_object(
    service: Service,
    body: type[Serializer] | None,
    answer: type[Serializer],
    status_code: int,
    doc: str | None,
    with_team: bool,
    target: dict[str, Selector],
) -> Handler:
    # Op.update's and Op.action's handler: the service called on the URL's object.
    name, selector = _target(target)
    responses = answer if status_code == status.HTTP_200_OK else {status_code: answer}

    @extend_schema(request=body, responses=responses)
    def handler(self, request: Request, **kwargs: Any) -> Response:
        obj = _url_object(self, selector)  # 404 before 400
        data = validated(body, request) if body else {}
        if with_team:
            data["team"] = request.team
        obj = service_call(service, actor=request.user, **{name: obj}, **data)
        return Response(answer(obj).data, status=status_code)

    handler.__doc__ = doc
    return handler


class Op:
    """The operations a team-scoped view declares (see above)."""

    @staticmethod
    def list(selector: Selector, answer: type[Serializer]) -> Handler:
        """GET: a page of ``selector(parent)``, each as ``answer`` (the view is a PaginatedList)."""

        @extend_schema(responses=answer(many=True))
        def get(self, request: Request, **kwargs: Any) -> Response:
            return self.paginated(request, selector(self.parent()), answer)

        return get

    @staticmethod
    def create(
        service: Service,
        *,
        body: type[Serializer],
        answer: type[Serializer],
        doc: str | None = None,
    ) -> Handler:
        """POST: ``service(actor=, team=, **the body)``, the body as ``body`` validates it; a 201
        with what the service made as ``answer``."""

        @extend_schema(request=body, responses={201: answer})
        def post(self, request: Request, **kwargs: Any) -> Response:
            data = validated(body, request)
            made = service_call(service, actor=request.user, team=request.team, **data)
            return created(answer, made)

        post.__doc__ = doc
        return post

    @staticmethod
    def retrieve(
        selector: Selector, answer: type[Serializer], *, doc: str | None = None
    ) -> Handler:
        """GET: the object the URL names, ``selector(parent, its id)``, as ``answer``."""

        @extend_schema(responses=answer)
        def get(self, request: Request, **kwargs: Any) -> Response:
            return Response(answer(_url_object(self, selector)).data)

        get.__doc__ = doc
        return get

    @staticmethod
    def update(
        service: Service,
        *,
        body: type[Serializer],
        answer: type[Serializer],
        doc: str | None = None,
        with_team: bool = False,
        **target: Selector,
    ) -> Handler:
        """PATCH: ``service(actor=, <name>=the object, **the body)`` for ``<name>=selector`` (the
        object the URL names, as ``retrieve`` finds it), also ``team=`` if ``with_team``; what
        the service answers as ``answer``."""
        return _on_object(service, body, answer, status.HTTP_200_OK, doc, with_team, target)

    @staticmethod
    def action(
        service: Service,
        *,
        answer: type[Serializer],
        body: type[Serializer] | None = None,
        status_code: int = status.HTTP_200_OK,
        doc: str | None = None,
        **target: Selector,
    ) -> Handler:
        """POST: as ``update`` (with the body if the action takes one); the answer with
        ``status_code``."""
        return _on_object(service, body, answer, status_code, doc, False, target)

    @staticmethod
    def delete(service: Service, **target: Selector) -> Handler:
        """DELETE: ``service(actor=, <name>=the object)`` for ``<name>=selector``; a 204."""
        name, selector = _target(target)

        @extend_schema(responses={204: None})
        def delete(self, request: Request, **kwargs: Any) -> Response:
            service_call(service, actor=request.user, **{name: _url_object(self, selector)})
            return Response(status=status.HTTP_204_NO_CONTENT)

        return delete


class MeView(APIView):
    @extend_schema(responses=UserSerializer)
    def get(self, request: Request) -> Response:
        return Response(UserSerializer(request.user).data)


class HealthView(APIView):
    @extend_schema(responses=HealthCheckSerializer(many=True))
    def get(self, request: Request) -> Response:
        checks = health.platform_health()
        return Response([c.as_dict() for c in checks])


class NodeList(PaginatedList, APIView):
    """The nodes, their devices and what holds each (named for the holder's team only)."""

    @extend_schema(responses=NodeSerializer(many=True))
    def get(self, request: Request) -> Response:
        paginator = self.pagination_class()
        nodes = paginator.paginate_queryset(selectors.nodes_with_devices(), request, view=self)
        data = NodeSerializer(selectors.nodes_overview(request.user, nodes), many=True).data
        return paginator.get_paginated_response(data)


class TokenListCreate(generics.ListCreateAPIView):
    serializer_class = ApiTokenSerializer

    def get_queryset(self):
        return selectors.user_api_tokens(self.request.user)

    @extend_schema(request=ApiTokenSerializer, responses={201: NewApiTokenSerializer})
    def post(self, request: Request) -> Response:
        data = validated(ApiTokenSerializer, request)
        token, key = service_call(
            services.api_token_create,
            actor=request.user,
            name=data["name"],
            expires_in_days=data.get("expires_in_days", "default"),
            # A token cannot mint one that outlives it.
            via_token=request.auth if isinstance(request.auth, ApiToken) else None,
        )
        token.key = key
        return created(NewApiTokenSerializer, token)


class TokenRevoke(APIView):
    @extend_schema(responses={200: ApiTokenSerializer})
    def delete(self, request: Request, token_id: int) -> Response:
        token = selectors.user_api_token_get(request.user, token_id)
        token = services.api_token_revoke(actor=request.user, token=token)
        return Response(ApiTokenSerializer(token).data)


class TeamListCreate(generics.ListCreateAPIView):
    serializer_class = TeamSerializer

    def get_queryset(self):
        return selectors.teams_for_user(self.request.user)

    def get_serializer_context(self) -> dict:
        roles = dict(
            Membership.objects.filter(user=self.request.user).values_list("team_id", "role")
        )
        return {**super().get_serializer_context(), "roles": roles}

    def perform_create(self, serializer: TeamSerializer) -> None:
        team = service_call(
            services.team_create, actor=self.request.user, name=serializer.validated_data["name"]
        )
        serializer.context["roles"][team.pk] = "owner"
        serializer.instance = team


class TeamDetail(TeamAPIView):
    @extend_schema(responses=TeamSerializer)
    def get(self, request: Request, team: str) -> Response:
        roles = {request.team.pk: request.membership.role}
        return Response(TeamSerializer(request.team, context={"roles": roles}).data)


class MemberListCreate(PaginatedList, TeamAPIView):
    write_permission = Perm.TEAM_MANAGE

    get = Op.list(selectors.team_memberships, MembershipSerializer)
    post = Op.create(services.membership_add, body=InviteSerializer, answer=MembershipSerializer)


class MemberDetail(TeamAPIView):
    write_permission = Perm.TEAM_MANAGE

    get = Op.retrieve(selectors.team_membership_get, MembershipSerializer)
    patch = Op.update(
        services.membership_change_role,
        membership=selectors.team_membership_get,
        body=RoleSerializer,
        answer=MembershipSerializer,
    )
    delete = Op.delete(services.membership_remove, membership=selectors.team_membership_get)


class AuditList(generics.ListAPIView):
    permission_classes = [TeamPermission]
    read_permission = Perm.AUDIT_VIEW
    serializer_class = AuditEventSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter("action", str, description="action prefix, e.g. `membership`"),
            OpenApiParameter("actor", str, description="username"),
            OpenApiParameter("since", str, description="YYYY-MM-DD"),
            OpenApiParameter("until", str, description="YYYY-MM-DD"),
        ]
    )
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        form = AuditFilterForm(self.request.query_params)
        if not form.is_valid():
            raise ValidationError(form.errors)
        events = selectors.team_audit_events(
            self.request.team, viewer=self.request.user, **form.cleaned_data
        )
        return events.select_related("team")  # each event names its team's slug


# -- Site staff: accounts, their tokens, lockouts --------------------------------------------


class UserTokenList(generics.ListAPIView):
    """Another account's personal API tokens (site staff)."""

    permission_classes = [StaffOnly]
    serializer_class = ApiTokenSerializer

    def get_queryset(self):
        return selectors.user_api_tokens(selectors.account_get(self.kwargs["user_id"]))


class UserTokenRevoke(APIView):
    permission_classes = [StaffOnly]

    @extend_schema(responses={200: ApiTokenSerializer})
    def delete(self, request: Request, user_id: int, token_id: int) -> Response:
        token = selectors.user_api_token_get(selectors.account_get(user_id), token_id)
        token = services.api_token_revoke(actor=request.user, token=token)
        return Response(ApiTokenSerializer(token).data)


class UserActive(APIView):
    """Deactivate an account (its sessions and tokens end) or activate it again."""

    permission_classes = [StaffOnly]

    @extend_schema(request=AccountActiveSerializer, responses={200: AccountActiveSerializer})
    def post(self, request: Request, user_id: int) -> Response:
        account = selectors.account_get(user_id)
        data = validated(AccountActiveSerializer, request)
        account = service_call(
            services.user_set_active,
            actor=request.user,
            user=account,
            active=data["is_active"],
        )
        return Response(AccountActiveSerializer(account).data)


class LockoutList(APIView):
    """The accounts and addresses locked out now (too many failed logins or unknown tokens);
    DELETE with ``?username=`` or ``?address=`` lifts one."""

    permission_classes = [StaffOnly]

    @extend_schema(responses=LockoutSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(LockoutSerializer(lockout.active_lockouts(), many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("username", str, description="the account to unlock"),
            OpenApiParameter("address", str, description="the IP address to unlock"),
        ],
        responses={200: None},
    )
    def delete(self, request: Request) -> Response:
        cleared = service_call(
            services.lockout_clear,
            actor=request.user,
            username=request.query_params.get("username", ""),
            address=request.query_params.get("address", ""),
        )
        return Response({"cleared": cleared})


def _usage_figures(start, team) -> dict:
    uses = usage.month_uses(start, team)
    quotas = (team.device_hours_quota or {}) if team else {}
    by_device = {d: h for (_t, d), h in usage.summary(uses, "team")} if team else {}
    return {
        "month": f"{start:%Y-%m}",
        "device_hours": [
            {"device_type": d, "hours": round(by_device.get(d, 0.0), 4), "quota": quotas.get(d)}
            for d in sorted(set(by_device) | set(quotas))
        ],
        "by_user": [
            {"username": u, "device_type": d, "hours": round(h, 4)}
            for (_t, u, d), h in usage.summary(uses, "user")
        ],
        "by_job": [
            {"job": j, "username": u, "device_type": d, "hours": round(h, 4)}
            for (_t, j, u, d), h in usage.summary(uses, "job")
        ],
    }


def _month_param(request: Request):
    query = UsageQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    month = query.validated_data.get("month")
    if not month:
        return usage.month_start()
    year, number = (int(x) for x in month.split("-"))
    return usage.month_start(datetime.date(year, number, 1))


class TeamUsage(TeamAPIView):
    """The team's device-hours in a month (``?month=YYYY-MM``, default this one): by device
    type against its quota, by user and by job; the same figures as the usage page."""

    @extend_schema(parameters=[UsageQuerySerializer], responses={200: None, 400: None})
    def get(self, request: Request, team: str) -> Response:
        start = _month_param(request)
        figures = _usage_figures(start, request.team)
        figures["endpoints"] = [r for c in usage.serving_usage for r in c(request.team, start)]
        figures["storage_bytes"] = quotas.team_storage_usage(request.team)
        figures["jobs_at_once"] = usage.concurrency_limit(request.team)
        return Response(figures)


QUOTA_FIELDS = (
    "max_concurrent_jobs",
    "device_hours_quota",
    "storage_quota_gb",
    "max_endpoints",
    "max_replicas",
)


class Quotas(APIView):
    """Site staff: every team's quotas and device-hours this month (GET), or set one team's
    (POST)."""

    permission_classes = [StaffOnly]

    @extend_schema(parameters=[UsageQuerySerializer], responses={200: None, 400: None})
    def get(self, request: Request) -> Response:
        start = _month_param(request)
        totals: dict[str, dict[str, float]] = {}
        for (team_name, device), hours in usage.summary(usage.month_uses(start), "team"):
            totals.setdefault(team_name, {})[device] = round(hours, 4)
        return Response(
            [
                {
                    "team": t.slug,
                    **{k: getattr(t, k) for k in QUOTA_FIELDS},
                    "month": f"{start:%Y-%m}",
                    "device_hours": totals.get(t.name, {}),
                }
                for t in Team.objects.order_by("name")
            ]
        )

    @extend_schema(request=TeamQuotasSerializer, responses=TeamQuotasSerializer)
    def post(self, request: Request) -> Response:
        body = TeamQuotasSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        team = Team.objects.filter(slug=data["team"]).first()
        if team is None:
            raise NotFound
        # What the request leaves out stays as it is.
        quotas = {k: data.get(k, getattr(team, k)) for k in QUOTA_FIELDS}
        team = service_call(services.team_quotas_set, actor=request.user, team=team, **quotas)
        return Response({"team": team.slug, **{k: getattr(team, k) for k in QUOTA_FIELDS}})
