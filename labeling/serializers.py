from rest_framework import serializers

from labeling.models import Dataset, DatasetVersion, ImportJob, Upload
from labeling.pipeline import DEFAULT_RATIOS
from labeling.readers import ENCODINGS, FORMATS
from labeling.task_kinds import KIND_CHOICES


class DatasetSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, default=None, allow_null=True
    )
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Dataset
        fields = [
            "id",
            "name",
            "task_kind",
            "description",
            "labels",
            "created_by",
            "created_at",
            "latest_version",
        ]
        read_only_fields = ["id", "created_by", "created_at", "latest_version"]

    def get_latest_version(self, dataset: Dataset) -> int | None:
        if hasattr(dataset, "latest_version_number"):  # selectors.team_datasets_overview
            return dataset.latest_version_number
        return max((v.number for v in dataset.versions.all()), default=None)


class DatasetCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    task_kind = serializers.ChoiceField(choices=KIND_CHOICES)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    labels = serializers.ListField(child=serializers.CharField(), required=False, default=list)


class VersionSerializer(serializers.ModelSerializer):
    parent = serializers.IntegerField(
        source="parent.number", read_only=True, default=None, allow_null=True
    )
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, default=None, allow_null=True
    )

    class Meta:
        model = DatasetVersion
        fields = [
            "number",
            "parent",
            "source",
            "lineage",
            "created_by",
            "created_at",
            "content_hash",
            "format",
            "encoding",
            "original_name",
            "options",
            "row_count",
            "rejected_count",
            "duplicate_count",
            "split_counts",
            "stats",
            "errors_by_reason",
        ]


def _split_ratios_field() -> serializers.ListField:
    """The train, dev and test shares of an import's or a merge's rows."""
    return serializers.ListField(
        child=serializers.FloatField(min_value=0),
        min_length=3,
        max_length=3,
        default=list(DEFAULT_RATIOS),
    )


class UploadSerializer(serializers.ModelSerializer):
    class Meta:
        model = Upload
        fields = ["id", "filename", "size", "received", "status", "sha256", "created_at"]
        read_only_fields = ["id", "received", "status", "sha256", "created_at"]


class ImportRequestSerializer(serializers.Serializer):
    upload = serializers.UUIDField()
    format = serializers.ChoiceField(choices=FORMATS, required=False)
    encoding = serializers.ChoiceField(choices=ENCODINGS, required=False)
    mapping = serializers.DictField(child=serializers.CharField(), required=False)
    fullwidth_to_halfwidth = serializers.BooleanField(default=False)
    drop_duplicates = serializers.BooleanField(default=True)
    strict = serializers.BooleanField(default=False)
    ratios = _split_ratios_field()
    seed = serializers.IntegerField(default=42)


class MergeRequestSerializer(serializers.Serializer):
    versions = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**31 - 1),
        min_length=2,
        max_length=100,
    )
    ratios = _split_ratios_field()
    seed = serializers.IntegerField(default=42)
    drop_duplicates = serializers.BooleanField(default=True)


class ImportJobSerializer(serializers.ModelSerializer):
    dataset = serializers.IntegerField(source="dataset_id", read_only=True)
    version = serializers.IntegerField(
        source="version.number", read_only=True, default=None, allow_null=True
    )
    identical_to = serializers.IntegerField(
        source="identical_to.number", read_only=True, default=None, allow_null=True
    )
    progress = serializers.IntegerField(source="progress_percent", read_only=True)

    class Meta:
        model = ImportJob
        fields = [
            "id",
            "dataset",
            "source",
            "status",
            "progress",
            "rows_read",
            "bytes_read",
            "bytes_total",
            "format",
            "encoding",
            "options",
            "error",
            "version",
            "identical_to",
            "created_at",
            "finished_at",
        ]


class LabelingProjectSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(max_length=100)
    dataset = serializers.IntegerField(source="source_version.dataset_id", read_only=True)
    version = serializers.IntegerField(source="source_version.number", read_only=True)
    labels = serializers.ListField(child=serializers.CharField(), read_only=True)
    instructions = serializers.CharField(read_only=True)
    overlap = serializers.IntegerField(read_only=True)
    selection = serializers.CharField(read_only=True)
    status = serializers.CharField(read_only=True)
    error = serializers.CharField(read_only=True)
    tasks_total = serializers.IntegerField(read_only=True)
    tasks_pushed = serializers.IntegerField(read_only=True)
    ls_project_id = serializers.IntegerField(read_only=True, allow_null=True)
    last_synced_at = serializers.DateTimeField(read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(read_only=True)


class LabelingProjectCreateSerializer(serializers.Serializer):
    dataset = serializers.IntegerField()
    version = serializers.IntegerField()
    name = serializers.CharField(max_length=100)
    labels = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    instructions = serializers.CharField(required=False, allow_blank=True, default="")
    overlap = serializers.IntegerField(min_value=1, max_value=10, default=1)
    selection = serializers.ChoiceField(
        choices=["all", "unlabeled", "sample", "split"], default="all"
    )
    sample_size = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    split = serializers.CharField(required=False, allow_blank=True, default="")
    seed = serializers.IntegerField(default=42)


class ExportRequestSerializer(serializers.Serializer):
    rule = serializers.ChoiceField(choices=["majority", "reviewer", "drop"])
    reviewer = serializers.CharField(required=False, allow_blank=True, default="")


class PredictionSerializer(serializers.Serializer):
    row = serializers.IntegerField(min_value=1)
    value = serializers.DictField()
    score = serializers.FloatField(min_value=0, max_value=1)


class PredictionsRequestSerializer(serializers.Serializer):
    model_version = serializers.CharField(max_length=100)
    predictions = PredictionSerializer(many=True)


class LabelsRequestSerializer(serializers.Serializer):
    labels = serializers.ListField(child=serializers.CharField(max_length=100), allow_empty=False)
