from rest_framework import serializers

from runtime.presets import LLM_PRESETS, PRESETS
from training.models import BaseModel, ModelVersion, TrainingEvent, TrainingJob


class BaseModelSerializer(serializers.ModelSerializer):
    shared = serializers.SerializerMethodField()
    owner = serializers.CharField(read_only=True)  # BaseModel.owner: "team" or "site"
    size_bytes = serializers.IntegerField(read_only=True)

    class Meta:
        model = BaseModel
        fields = [
            "id",
            "name",
            "backend",
            "architecture",
            "summary",
            "manifest",
            "source",
            "shared",
            "owner",
            "size_bytes",
            "created_at",
        ]

    def get_shared(self, model: BaseModel) -> bool:
        return model.team_id is None


class BaseModelImportSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    backend = serializers.ChoiceField(choices=["paddle", "torch"], default="paddle")
    # A directory or archive under PLATFORM_MODEL_IMPORT_DIR on the server…
    path = serializers.CharField(required=False, allow_blank=True, default="")
    # …or an uploaded .tar/.tar.gz/.zip (multipart).
    archive = serializers.FileField(required=False, allow_null=True, default=None)
    shared = serializers.BooleanField(default=False)


class BaseModelShareSerializer(serializers.Serializer):
    """Site staff only: publish to every team of the site, or take back into this team."""

    shared = serializers.BooleanField()


class JobSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(source="dataset_version.dataset.name", read_only=True)
    dataset_id = serializers.IntegerField(source="dataset_version.dataset_id", read_only=True)
    dataset_version = serializers.IntegerField(source="dataset_version.number", read_only=True)
    base_model = serializers.CharField(
        source="base_model.name", read_only=True, default=None, allow_null=True
    )
    # "team" or "site": which base model of that name the job took (the team's own wins).
    base_model_owner = serializers.CharField(
        source="base_model.owner", read_only=True, default=None, allow_null=True
    )
    model_version = serializers.SerializerMethodField()
    progress_percent = serializers.IntegerField(read_only=True)

    class Meta:
        model = TrainingJob
        fields = [
            "id",
            "name",
            "status",
            "phase",
            "waiting_reason",
            "error",
            "dataset",
            "dataset_id",
            "dataset_version",
            "task_kind",
            "labels",
            "backend",
            "base_model",
            "base_model_owner",
            "preset",
            "hyperparameters",
            "device_type",
            "device_count",
            "priority",
            "max_hours",
            "origin",
            "attempts",
            "worker",
            "step",
            "total_steps",
            "epoch",
            "epochs",
            "samples_per_s",
            "eta_s",
            "progress_percent",
            "created_at",
            "started_at",
            "first_step_at",
            "finished_at",
            "model_version",
        ]

    def get_model_version(self, job: TrainingJob) -> int | None:
        version = getattr(job, "model_version", None)
        return version.pk if version else None


class JobSubmitSerializer(serializers.Serializer):
    dataset_id = serializers.IntegerField()
    dataset_version = serializers.IntegerField(help_text="The version's number in its dataset.")
    backend = serializers.CharField(default="paddle")
    base_model = serializers.CharField(required=False, allow_blank=True, default="")
    preset = serializers.CharField(required=False, allow_blank=True, default="")
    hyperparameters = serializers.DictField(required=False, default=dict)
    device_type = serializers.CharField(default="cpu")
    device_count = serializers.IntegerField(default=1, min_value=1)
    priority = serializers.ChoiceField(
        choices=TrainingJob.Priority.choices,
        default=5,
        help_text="0 top (the team's owners and site staff only), 2 high, 5 normal, 9 low.",
    )
    max_hours = serializers.FloatField(
        required=False,
        allow_null=True,
        default=None,
        help_text="The job's maximum run time; at most TRAINING_MAX_HOURS (the default).",
    )
    name = serializers.CharField(required=False, allow_blank=True, default="")


class JobCloneSerializer(serializers.Serializer):
    hyperparameters = serializers.DictField(required=False)
    backend = serializers.CharField(required=False)
    base_model = serializers.CharField(required=False, allow_blank=True)
    preset = serializers.CharField(required=False, allow_blank=True)
    device_type = serializers.CharField(required=False)
    device_count = serializers.IntegerField(required=False, min_value=1)
    priority = serializers.ChoiceField(choices=TrainingJob.Priority.choices, required=False)
    max_hours = serializers.FloatField(required=False, allow_null=True)
    name = serializers.CharField(required=False, allow_blank=True)


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = TrainingEvent
        fields = ["id", "kind", "attempt", "data", "created_at"]


class JobEventsSerializer(serializers.Serializer):
    job = JobSerializer()
    events = EventSerializer(many=True)


class ModelVersionSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(
        source="dataset_version.dataset.name", default=None, allow_null=True
    )
    dataset_version = serializers.IntegerField(
        source="dataset_version.number", default=None, allow_null=True
    )

    class Meta:
        model = ModelVersion
        fields = [
            "id",
            "uid",
            "name",
            "number",
            "source",
            "job",
            "dataset",
            "dataset_version",
            "task_kind",
            "labels",
            "backend",
            "runtime",
            "base",
            "hyperparameters",
            "metrics",
            "manifest",
            "provenance",
            "created_at",
        ]


class ModelVersionDetailSerializer(ModelVersionSerializer):
    class Meta(ModelVersionSerializer.Meta):
        fields = [*ModelVersionSerializer.Meta.fields, "evaluation", "files"]


class BaseModelFromVersionSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)


class ModelImportSerializer(serializers.Serializer):
    archive = serializers.FileField()


class PresetSerializer(serializers.Serializer):
    name = serializers.ChoiceField(choices=[*PRESETS, *LLM_PRESETS])
    config = serializers.DictField()
    # A causal LM for instruction and preference data.
    generative = serializers.BooleanField()
