from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from runtime.compress import MODES as QUANTIZATION_MODES
from runtime.presets import FAST_PRESETS, LLM_PRESETS, PRESETS
from training.compression import MAX_CALIBRATION_ROWS
from training.models import (
    BaseModel,
    ModelEvaluation,
    ModelVersion,
    Sweep,
    TrainingEvent,
    TrainingJob,
)
from training.registry import model_version_targets
from training.sweeps import param_importances, sweep_trials


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
    # A pretraining's result (objective "mlm"): the base model it made, by name.
    pretrained_model = serializers.CharField(
        source="pretrained_model.name", read_only=True, default=None, allow_null=True
    )
    progress_percent = serializers.IntegerField(read_only=True)
    # In the request's language.
    waiting_reason = serializers.CharField(source="waiting", read_only=True)

    class Meta:
        model = TrainingJob
        fields = [
            "id",
            "name",
            "status",
            "phase",
            "waiting_reason",
            "paused_at",
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
            "objective",
            "parent_version",
            "pretrained_model",
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
    objective = serializers.ChoiceField(
        choices=TrainingJob.Objective.choices,
        required=False,
        allow_blank=True,
        default="",
        help_text="mlm: pretrain an encoder on the version's texts (masked language modelling); "
        "its result is a base model of the team named as the job (default <dataset>-dapt).",
    )


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
    # The model beside its baselines (ModelVersion.baseline_comparison); null without them.
    baseline_comparison = serializers.JSONField(read_only=True, allow_null=True)

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
            "baseline_comparison",
            "manifest",
            "provenance",
            "parent",
            "compression",
            "created_at",
        ]


class ModelTargetSerializer(serializers.Serializer):
    """An export target of a version (training.registry.model_version_targets): download it
    with ``download/?target=<name>``."""

    name = serializers.CharField()
    runtime = serializers.CharField(allow_null=True, required=False)
    status = serializers.ChoiceField(choices=["ready", "failed"])
    agreement = serializers.FloatField(allow_null=True, required=False)
    size = serializers.IntegerField(allow_null=True)
    error = serializers.CharField(required=False)


class ModelVersionDetailSerializer(ModelVersionSerializer):
    targets = serializers.SerializerMethodField()

    class Meta(ModelVersionSerializer.Meta):
        fields = [*ModelVersionSerializer.Meta.fields, "evaluation", "files", "targets"]

    @extend_schema_field(ModelTargetSerializer(many=True))
    def get_targets(self, version: ModelVersion) -> list[dict]:
        return model_version_targets(version)


class CompressSerializer(serializers.Serializer):
    """Compression of a version (training.compression): ``int8`` quantization (dynamic, or
    static calibrated on ``calibration_rows`` rows of the dev split), or ``distill`` into a
    ``student``: a preset (default: ernie-micro-char) or the name of an encoder imported as a
    base model (the service checks it)."""

    method = serializers.ChoiceField(choices=["int8", "distill"], default="int8")
    student = serializers.CharField(max_length=100, required=False)
    # The student's hyperparameters over its recommended ones (distill only), checked as a
    # job's are.
    hyperparameters = serializers.DictField(required=False)
    mode = serializers.ChoiceField(choices=list(QUANTIZATION_MODES), default="dynamic")
    calibration_rows = serializers.IntegerField(
        min_value=1, max_value=MAX_CALIBRATION_ROWS, default=200
    )


class BaseModelFromVersionSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)


class ModelImportSerializer(serializers.Serializer):
    archive = serializers.FileField()


class PresetSerializer(serializers.Serializer):
    name = serializers.ChoiceField(choices=[*FAST_PRESETS, *PRESETS, *LLM_PRESETS])
    config = serializers.DictField()
    # A causal LM for instruction and preference data.
    generative = serializers.BooleanField()
    # A fast model's task kinds (it trains on the paddle backend only); null: every kind.
    kinds = serializers.ListField(child=serializers.CharField(), allow_null=True)


class SweepSerializer(serializers.ModelSerializer):
    dataset_id = serializers.IntegerField(source="dataset_version.dataset_id", read_only=True)
    dataset_version = serializers.IntegerField(source="dataset_version.number", read_only=True)

    class Meta:
        model = Sweep
        fields = [
            "id",
            "name",
            "status",
            "dataset_id",
            "dataset_version",
            "backend",
            "base_model",
            "preset",
            "device_type",
            "n_trials",
            "parallel",
            "space",
            "hyperparameters",
            "metric",
            "seed",
            "error",
            "best_job",
            "best_model_version",
            "created_at",
            "finished_at",
        ]


class SweepTrialSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    job_id = serializers.IntegerField()
    status = serializers.CharField()
    pruned = serializers.BooleanField()
    params = serializers.DictField(help_text="The hyperparameters searched, as the trial had them.")
    value = serializers.FloatField(
        allow_null=True, help_text="The dev metric of its best checkpoint (so far, if running)."
    )
    model_version_id = serializers.IntegerField(allow_null=True)
    best = serializers.BooleanField()


class SweepDetailSerializer(SweepSerializer):
    trials = serializers.SerializerMethodField()
    importances = serializers.SerializerMethodField()

    class Meta(SweepSerializer.Meta):
        fields = [*SweepSerializer.Meta.fields, "trials", "importances"]

    @extend_schema_field(SweepTrialSerializer(many=True))
    def get_trials(self, sweep: Sweep) -> list[dict]:
        return SweepTrialSerializer(sweep_trials(sweep), many=True).data

    @extend_schema_field(serializers.DictField(child=serializers.FloatField()))
    def get_importances(self, sweep: Sweep) -> dict[str, float]:
        """Each hyperparameter's share of the dev metric's variation (empty before two trials
        have finished)."""
        return param_importances(sweep, list(sweep.trials.all()))


class SweepCreateSerializer(serializers.Serializer):
    dataset_id = serializers.IntegerField()
    dataset_version = serializers.IntegerField(help_text="The version's number in its dataset.")
    space = serializers.DictField(
        help_text="Per hyperparameter searched (learning_rate, batch_size, dropout, weight_decay, "
        'epochs, warmup_ratio, max_seq_length): {"low", "high", "log"} or {"choices": [...]}.'
    )
    n_trials = serializers.IntegerField(default=10, min_value=2)
    parallel = serializers.IntegerField(default=1, min_value=1)
    backend = serializers.CharField(default="paddle")
    base_model = serializers.CharField(required=False, allow_blank=True, default="")
    preset = serializers.CharField(required=False, allow_blank=True, default="")
    device_type = serializers.CharField(default="cpu")
    metric = serializers.ChoiceField(
        choices=["macro_f1", "micro_f1", "weighted_f1", "accuracy"], default="macro_f1"
    )
    hyperparameters = serializers.DictField(
        required=False, default=dict, help_text="Those every trial shares (not searched)."
    )
    name = serializers.CharField(required=False, allow_blank=True, default="")
    seed = serializers.IntegerField(default=0, min_value=0)


class EvaluateSerializer(serializers.Serializer):
    """An evaluate job (training.evaluations): the version scored on an evaluation set."""

    evaluation_set = serializers.IntegerField(
        help_text="The id of a dataset version of the kind evaluation."
    )
    max_new_tokens = serializers.IntegerField(default=64, min_value=1, max_value=1024)


class ModelEvaluationSerializer(serializers.ModelSerializer):
    model_version_name = serializers.CharField(source="model_version.__str__", read_only=True)
    evaluation_set = serializers.CharField(source="dataset_version.__str__", read_only=True)

    class Meta:
        model = ModelEvaluation
        fields = [
            "id",
            "model_version",
            "model_version_name",
            "dataset_version",
            "evaluation_set",
            "job",
            "status",
            "endpoint",
            "metrics",
            "subjects",
            "mistakes",
            "seconds",
            "created_at",
        ]


class LeaderboardRowSerializer(serializers.Serializer):
    rank = serializers.IntegerField()
    evaluation = ModelEvaluationSerializer()


class LeaderboardSerializer(serializers.Serializer):
    ranked_by = serializers.CharField(allow_null=True)
    figures = serializers.ListField(child=serializers.CharField())
    subjects = serializers.ListField(child=serializers.CharField())
    rows = LeaderboardRowSerializer(many=True)
