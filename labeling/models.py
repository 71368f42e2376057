import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from console.models import Created, Team
from labeling.task_kinds import KIND_CHOICES


class Dataset(Created):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(_("name"), max_length=100)
    task_kind = models.CharField(_("task kind"), max_length=32, choices=KIND_CHOICES)
    description = models.TextField(_("description"), blank=True)
    # The allowed labels; empty means any label found in the data is accepted.
    labels = models.JSONField(_("labels"), default=list, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="dataset_name_unique_in_team")
        ]

    def __str__(self) -> str:
        return self.name

    def label_set(self) -> frozenset[str] | None:
        return frozenset(self.labels) if self.labels else None


class Upload(Created):
    """A file sent in chunks. Its bytes stay in the staging directory until it is complete."""

    class Status(models.TextChoices):
        RECEIVING = "receiving", _("receiving")
        COMPLETE = "complete", _("complete")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="uploads")
    filename = models.CharField(max_length=255)
    size = models.BigIntegerField()
    received = models.BigIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RECEIVING)
    sha256 = models.CharField(max_length=64, blank=True)
    # The storage name once complete; never derived from the user's file name.
    storage_name = models.CharField(max_length=255, blank=True)

    def __str__(self) -> str:
        return self.filename


class DatasetVersion(Created):
    """An immutable version of a dataset: normalised rows in storage, with their report."""

    class Source(models.TextChoices):
        UPLOAD = "upload", _("upload")
        LABELING = "labeling", _("labeling export")
        MERGE = "merge", _("merge")

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    source = models.CharField(max_length=16, choices=Source.choices)
    # Lineage beyond the parent: the upload, the merged versions, the labeling project.
    lineage = models.JSONField(default=dict, blank=True)
    content_hash = models.CharField(max_length=64, db_index=True)
    format = models.CharField(max_length=8)
    encoding = models.CharField(max_length=16, blank=True)
    original_name = models.CharField(max_length=255, blank=True)
    options = models.JSONField(default=dict)
    row_count = models.PositiveIntegerField()
    rejected_count = models.PositiveIntegerField()
    duplicate_count = models.PositiveIntegerField()
    split_counts = models.JSONField(default=dict)
    stats = models.JSONField(default=dict)
    errors_by_reason = models.JSONField(default=dict)
    page_index = models.JSONField(default=list)
    data_file = models.CharField(max_length=255)
    report_file = models.CharField(max_length=255)
    original_file = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["dataset", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "number"], name="version_number_unique")
        ]

    def __str__(self) -> str:
        return f"{self.dataset.name} v{self.number}"

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:
            raise ValueError("A dataset version is immutable once made.")
        super().save(*args, **kwargs)


class ImportJob(Created):
    """An import of an upload into a new version, run on the Celery `default` queue."""

    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        RUNNING = "running", _("running")
        SUCCEEDED = "succeeded", _("succeeded")
        FAILED = "failed", _("failed")

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="import_jobs")
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="imports")
    upload = models.ForeignKey(Upload, null=True, on_delete=models.SET_NULL, related_name="+")
    source = models.CharField(max_length=16, choices=DatasetVersion.Source.choices)
    parents = models.JSONField(default=list, blank=True)  # version ids, for merges
    format = models.CharField(max_length=8)
    encoding = models.CharField(max_length=16, blank=True)
    options = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    rows_read = models.PositiveIntegerField(default=0)
    bytes_total = models.BigIntegerField(default=0)
    bytes_read = models.BigIntegerField(default=0)
    error = models.TextField(blank=True)
    version = models.ForeignKey(
        DatasetVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # An import whose rows equal an existing version's makes none; this names that version.
    identical_to = models.ForeignKey(
        DatasetVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    report_file = models.CharField(max_length=255, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"import #{self.pk} → {self.dataset}"

    @property
    def progress_percent(self) -> int:
        if self.status == self.Status.SUCCEEDED:
            return 100
        if not self.bytes_total:
            return 0
        return min(99, int(100 * self.bytes_read / self.bytes_total))


class LabelingProject(Created):
    """A Label Studio project made from a dataset version; its export is a new version."""

    class Status(models.TextChoices):
        CREATING = "creating", _("creating")
        READY = "ready", _("ready")
        FAILED = "failed", _("failed")

    class Selection(models.TextChoices):
        ALL = "all", _("all rows")
        UNLABELED = "unlabeled", _("unlabeled rows only")
        SAMPLE = "sample", _("a random sample")
        SPLIT = "split", _("one split")

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="labeling_projects")
    # PROTECT: a dataset whose version is being labeled cannot be deleted.
    source_version = models.ForeignKey(
        DatasetVersion, on_delete=models.PROTECT, related_name="labeling_projects"
    )
    name = models.CharField(_("name"), max_length=100)
    labels = models.JSONField(_("labels"), default=list)
    instructions = models.TextField(_("instructions"), blank=True)
    overlap = models.PositiveSmallIntegerField(_("annotators per task"), default=1)
    selection = models.CharField(
        _("rows"), max_length=16, choices=Selection.choices, default=Selection.ALL
    )
    sample_size = models.PositiveIntegerField(null=True, blank=True)
    split = models.CharField(max_length=8, blank=True)
    seed = models.IntegerField(default=42)
    ls_project_id = models.PositiveIntegerField(null=True, blank=True)
    # The secret Label Studio's webhook sends in a header; only its hash is kept.
    webhook_secret_hash = models.CharField(max_length=64, blank=True)
    # The URL the webhook was registered with: registered again when PLATFORM_URL or the route
    # changed (labeling.sync.labeling_project_sync).
    webhook_url = models.CharField(max_length=500, blank=True)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CREATING)
    # When its last push was queued: a push still "creating" long after is pushed again.
    push_queued_at = models.DateTimeField(null=True, blank=True)
    tasks_total = models.PositiveIntegerField(default=0)
    tasks_pushed = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("labeling project")

    def __str__(self) -> str:
        return self.name


class LabelingTask(models.Model):
    """One row of the source version as a Label Studio task."""

    project = models.ForeignKey(LabelingProject, on_delete=models.CASCADE, related_name="tasks")
    row = models.PositiveIntegerField()  # 1-based row number in the source version
    ls_task_id = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "row"], name="one_task_per_row"),
            models.UniqueConstraint(fields=["project", "ls_task_id"], name="one_row_per_task"),
        ]

    def __str__(self) -> str:
        return f"{self.project} row {self.row}"


class Annotation(models.Model):
    """An annotation made in Label Studio, as the platform took it in and checked it."""

    project = models.ForeignKey(
        LabelingProject, on_delete=models.CASCADE, related_name="annotations"
    )
    task = models.ForeignKey(LabelingTask, on_delete=models.CASCADE, related_name="annotations")
    ls_annotation_id = models.PositiveIntegerField()
    # Who made it, as Label Studio knows them (its user id and email).
    annotator_ls_id = models.PositiveIntegerField(null=True)
    annotator = models.CharField(max_length=254, blank=True)
    # The annotation in the dataset's terms: {"label": …}, {"labels": […]}, {"entities": […]}.
    value = models.JSONField(default=dict)
    valid = models.BooleanField(default=True)
    error = models.TextField(blank=True)
    # Why it does not count although Label Studio has it (its account is no current member of
    # the team with a labeling role); empty when it counts. Decided again at every sync.
    rejected = models.CharField(max_length=300, blank=True)
    ls_updated_at = models.DateTimeField(null=True)
    synced_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "ls_annotation_id"], name="one_row_per_ls_annotation"
            )
        ]

    def __str__(self) -> str:
        return f"{self.project} annotation {self.ls_annotation_id}"


class LabelStudioAccount(models.Model):
    """The Label Studio user that stands for a platform user. Its password is derived from the
    platform's secret (never stored); the user never sees it: the platform logs them in."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="label_studio_account"
    )
    ls_user_id = models.PositiveIntegerField(unique=True)
    email = models.CharField(max_length=254, unique=True)
    # The team whose organisation the account works in (Label Studio's active organisation).
    active_team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.email
