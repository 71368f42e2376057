from rest_framework import serializers

from console.services import KEY_MAX_DAYS
from deployment.models import (
    MAX_TOKENS_DEFAULT,
    MAX_TOKENS_LIMIT,
    Endpoint,
    EndpointAdapter,
    EndpointKey,
    Placement,
    Revision,
)
from runtime.chat import ROLES


class PlacementSerializer(serializers.ModelSerializer):
    host = serializers.CharField(source="host.url")

    class Meta:
        model = Placement
        fields = ["host", "state", "error", "replicas_ready", "updated_at"]


class RevisionSerializer(serializers.ModelSerializer):
    model_version = serializers.PrimaryKeyRelatedField(read_only=True)
    model = serializers.CharField(source="model_version.__str__", read_only=True)
    placements = PlacementSerializer(many=True, read_only=True)
    key = serializers.CharField(read_only=True)

    class Meta:
        model = Revision
        fields = [
            "id",
            "number",
            "key",
            "model_version",
            "model",
            "status",
            "weight",
            "replicas",
            "device_type",
            "max_batch_size",
            "max_wait_ms",
            "engine",
            "placements",
            "created_at",
            "promoted_at",
            "retired_at",
        ]


COMPARISON_HELP = (
    "The model version beside the one the endpoint serves (deployment.quality): metric, serving"
    " and candidate (value, split, rows, dataset_version), delta, per_label F1, same_split,"
    " worse, tolerance, caveat; null where nothing compares (nothing served yet, a generative"
    " model)."
)


class RevisionCreatedSerializer(RevisionSerializer):
    comparison = serializers.JSONField(read_only=True, allow_null=True, help_text=COMPARISON_HELP)

    class Meta(RevisionSerializer.Meta):
        fields = [*RevisionSerializer.Meta.fields, "comparison"]


class ComparisonSerializer(serializers.Serializer):
    comparison = serializers.JSONField(read_only=True, allow_null=True, help_text=COMPARISON_HELP)


class EndpointSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()
    stable_revision = serializers.PrimaryKeyRelatedField(read_only=True, allow_null=True)

    class Meta:
        model = Endpoint
        fields = [
            "id",
            "name",
            "description",
            "task_kind",
            "url",
            "stable_revision",
            "max_inputs",
            "max_tokens",
            "created_at",
        ]

    def get_url(self, endpoint: Endpoint) -> str:
        return endpoint.inference_url


class EndpointDetailSerializer(EndpointSerializer):
    revisions = serializers.SerializerMethodField()
    state = serializers.CharField(read_only=True)

    class Meta(EndpointSerializer.Meta):
        fields = [*EndpointSerializer.Meta.fields, "state", "revisions"]

    def get_revisions(self, endpoint: Endpoint) -> list[dict]:
        return RevisionSerializer(self.context["revisions"], many=True).data


class EndpointPromotedSerializer(EndpointDetailSerializer):
    """The endpoint after a promotion, with the promoted version beside the one it replaced."""

    comparison = serializers.JSONField(read_only=True, allow_null=True, help_text=COMPARISON_HELP)

    class Meta(EndpointDetailSerializer.Meta):
        fields = [*EndpointDetailSerializer.Meta.fields, "comparison"]


class KnobsSerializer(serializers.Serializer):
    device_type = serializers.CharField(default="cpu")
    replicas = serializers.IntegerField(default=1)
    max_batch_size = serializers.IntegerField(default=32)
    max_wait_ms = serializers.FloatField(default=5.0)
    engine = serializers.CharField(
        default="builtin", help_text="builtin, or an LLM engine of the hosts: vllm, fastdeploy"
    )


class DeploySerializer(KnobsSerializer):
    model_version = serializers.IntegerField()
    name = serializers.CharField(max_length=60, required=False, allow_blank=True, default="")
    description = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default=""
    )
    max_inputs = serializers.IntegerField(default=64, help_text="inputs per request, 1 to 256")
    max_tokens = serializers.IntegerField(
        default=MAX_TOKENS_DEFAULT,
        help_text=f"generative models: a reply's tokens at most, 1 to {MAX_TOKENS_LIMIT}; "
        "a request asking more is capped to it",
    )


class CanarySerializer(KnobsSerializer):
    model_version = serializers.IntegerField()
    weight = serializers.IntegerField(default=10)


class WeightSerializer(serializers.Serializer):
    weight = serializers.IntegerField()


class KeySerializer(serializers.ModelSerializer):
    class Meta:
        model = EndpointKey
        fields = [
            "id",
            "name",
            "prefix",
            "rate_per_s",
            "adapters",
            "created_at",
            "revoked_at",
            "expires_at",
        ]


class KeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    adapters = serializers.ListField(
        child=serializers.CharField(max_length=60),
        required=False,
        default=list,
        max_length=64,
        help_text="The endpoint's adapters the key may call, and only those; empty: all.",
    )
    rate_per_s = serializers.FloatField(required=False, allow_null=True, default=None)
    expires_in_days = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=1,
        max_value=KEY_MAX_DAYS,
        help_text="Days until the key expires; null or left out: never.",
    )


class KeyCreatedSerializer(KeySerializer):
    key = serializers.CharField(help_text="The key itself: shown this once, stored only hashed.")

    class Meta(KeySerializer.Meta):
        fields = [*KeySerializer.Meta.fields, "key"]


class AdapterSerializer(serializers.ModelSerializer):
    model = serializers.SerializerMethodField(help_text='OpenAI\'s "model" to call it with.')
    state = serializers.SerializerMethodField(
        help_text="Per serving host (url): its state there, and the error where it failed."
    )

    class Meta:
        model = EndpointAdapter
        fields = ["id", "name", "model", "model_version", "rate_per_s", "created_at", "state"]

    def get_model(self, adapter: EndpointAdapter) -> str:
        return f"{adapter.endpoint.name}/{adapter.name}"

    def get_state(self, adapter: EndpointAdapter) -> dict[str, dict]:
        placements = Placement.objects.filter(
            revision__endpoint_id=adapter.endpoint_id, revision__status="active"
        ).select_related("host")
        return {
            p.host.url: p.adapters[adapter.name] for p in placements if adapter.name in p.adapters
        }


class AdapterCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=60)
    model_version = serializers.IntegerField(help_text="A LoRA version of the same base model.")
    rate_per_s = serializers.FloatField(required=False, allow_null=True, default=None)


class PredictSerializer(serializers.Serializer):
    inputs = serializers.ListField(child=serializers.JSONField(), allow_empty=False)
    top_k = serializers.IntegerField(default=5, min_value=1)


class ChatMessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=ROLES)
    content = serializers.CharField(trim_whitespace=False, max_length=20_000)


class ChatSerializer(serializers.Serializer):
    """The playground's chat: OpenAI's chat-completion parameters that it offers."""

    messages = ChatMessageSerializer(many=True, allow_empty=False)
    max_tokens = serializers.IntegerField(required=False, min_value=1)
    temperature = serializers.FloatField(required=False, min_value=0, max_value=2)
    top_p = serializers.FloatField(required=False, min_value=0.000001, max_value=1)


class PreannotateSerializer(serializers.Serializer):
    endpoint = serializers.IntegerField()


class EndpointEvaluateSerializer(serializers.Serializer):
    evaluation_set = serializers.IntegerField(
        help_text="The id of a dataset version of the kind evaluation."
    )
    adapter = serializers.CharField(
        default="", allow_blank=True, max_length=60, help_text="Empty: the endpoint's model."
    )
    max_new_tokens = serializers.IntegerField(default=64, min_value=1, max_value=1024)
