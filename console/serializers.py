from django.contrib.auth import get_user_model
from rest_framework import serializers

from console.models import ApiToken, AuditEvent, Device, Membership, Node, Team
from console.roles import Role
from console.services import KEY_MAX_DAYS


class UserSerializer(serializers.ModelSerializer):
    class Meta:
        model = get_user_model()
        fields = ["id", "username", "is_staff"]


class TeamSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["slug", "name", "created_at", "role"]
        read_only_fields = ["slug", "created_at", "role"]

    def get_role(self, team: Team) -> str | None:
        roles = self.context.get("roles", {})
        return roles.get(team.pk)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        # mapped_from: the directory group that keeps this membership (console/directory.py).
        fields = ["id", "username", "role", "mapped_from", "created_at"]
        read_only_fields = ["id", "username", "mapped_from", "created_at"]


class InviteSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class RoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class ApiTokenSerializer(serializers.ModelSerializer):
    expires_in_days = serializers.IntegerField(
        write_only=True,
        required=False,
        allow_null=True,
        min_value=1,
        max_value=KEY_MAX_DAYS,
        help_text="Days until the token expires; null: never; left out: the platform's default "
        "(API_TOKEN_DEFAULT_DAYS, 90 unless configured).",
    )

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "created_at",
            "last_used_at",
            "revoked_at",
            "expires_at",
            "expires_in_days",
        ]
        read_only_fields = [
            "id",
            "prefix",
            "created_at",
            "last_used_at",
            "revoked_at",
            "expires_at",
        ]


class NewApiTokenSerializer(ApiTokenSerializer):
    key = serializers.CharField(read_only=True, help_text="Shown once; only its hash is stored.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "key"]


class AuditEventSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    actor = serializers.CharField(source="actor_username", read_only=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "created_at",
            "team",
            "actor",
            "action",
            "target_type",
            "target_id",
            "target_repr",
            "ip_address",
            "data",
        ]


class HealthCheckSerializer(serializers.Serializer):
    name = serializers.CharField()
    ok = serializers.BooleanField()
    detail = serializers.CharField()


class DeviceSerializer(serializers.ModelSerializer):
    held_by = serializers.CharField(source="shown_holder", read_only=True)

    class Meta:
        model = Device
        fields = ["device_type", "index", "name", "memory", "held_by", "held_since"]


class NodeSerializer(serializers.ModelSerializer):
    alive = serializers.BooleanField(read_only=True)
    devices = DeviceSerializer(many=True, read_only=True)

    class Meta:
        model = Node
        fields = [
            "name",
            "alive",
            "simulated",
            "queues",
            "started_at",
            "heartbeat_at",
            "stopped_at",
            "devices",
        ]


class AccountActiveSerializer(serializers.ModelSerializer):
    class Meta:
        model = get_user_model()
        fields = ["id", "username", "is_active"]
        read_only_fields = ["id", "username"]
        extra_kwargs = {"is_active": {"required": True}}


class LockoutSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["account", "address"])
    value = serializers.CharField()
    failures = serializers.IntegerField()
    until = serializers.DateTimeField()


class UsageQuerySerializer(serializers.Serializer):
    month = serializers.RegexField(r"^2\d{3}-(0[1-9]|1[0-2])$", required=False)  # YYYY-MM


class TeamQuotasSerializer(serializers.Serializer):
    """A team's quotas, as site staff set them (null: the site's default, or no limit)."""

    team = serializers.SlugField()
    max_concurrent_jobs = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=1000
    )
    device_hours_quota = serializers.DictField(
        child=serializers.FloatField(min_value=0, max_value=100_000), required=False
    )
    storage_quota_gb = serializers.FloatField(
        required=False, allow_null=True, min_value=0, max_value=10**7
    )
    max_endpoints = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=10_000
    )
    max_replicas = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=10_000
    )
