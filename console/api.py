"""REST API of the platform core, under /api/v1/. Views are thin: services write, selectors read."""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from console import health, lockout, selectors, services
from console.forms import AuditFilterForm
from console.models import ApiToken, Membership
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
    TeamSerializer,
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

    @extend_schema(responses=MembershipSerializer(many=True))
    def get(self, request: Request, team: str) -> Response:
        memberships = selectors.team_memberships(request.team)
        return self.paginated(request, memberships, MembershipSerializer)

    @extend_schema(request=InviteSerializer, responses={201: MembershipSerializer})
    def post(self, request: Request, team: str) -> Response:
        data = validated(InviteSerializer, request)
        membership = service_call(
            services.membership_add,
            actor=request.user,
            team=request.team,
            **data,
        )
        return created(MembershipSerializer, membership)


class MemberDetail(TeamAPIView):
    write_permission = Perm.TEAM_MANAGE

    @extend_schema(responses=MembershipSerializer)
    def get(self, request: Request, team: str, membership_id: int) -> Response:
        membership = selectors.team_membership_get(request.team, membership_id)
        return Response(MembershipSerializer(membership).data)

    @extend_schema(request=RoleSerializer, responses=MembershipSerializer)
    def patch(self, request: Request, team: str, membership_id: int) -> Response:
        membership = selectors.team_membership_get(request.team, membership_id)
        data = validated(RoleSerializer, request)
        membership = service_call(
            services.membership_change_role,
            actor=request.user,
            membership=membership,
            role=data["role"],
        )
        return Response(MembershipSerializer(membership).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, team: str, membership_id: int) -> Response:
        membership = selectors.team_membership_get(request.team, membership_id)
        service_call(services.membership_remove, actor=request.user, membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


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
