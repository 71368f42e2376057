import uuid

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from console.later import shown
from console.models import Created, Team
from labeling.models import DatasetVersion
from labeling.task_kinds import KIND_CHOICES
from runtime.baselines import PRIMARY_METRICS


def files_bytes(files: dict) -> int:
    """The bytes of ``{path: {"size": …}}``, as a manifest or a version lists its files."""
    return sum(int(f.get("size") or 0) for f in (files or {}).values() if isinstance(f, dict))


# The dev metrics that can pick a job's best checkpoint (and a sweep's best trial).
DEV_METRICS = ("macro_f1", "micro_f1", "weighted_f1", "accuracy")
# A generative model's figure, where its kind has none in PRIMARY_METRICS (runtime.llm's report).
GENERATIVE_HEADLINES = ("rouge_l", "exact_match", "accuracy_generation")


class Backend(models.TextChoices):
    PADDLE = "paddle", "PaddlePaddle (PaddleNLP)"
    TORCH = "torch", "PyTorch (Transformers)"


# The base models that are causal LMs, as a query (has_key first: a summary without the key
# must not make the comparison NULL, which a NOT would drop).
CAUSAL_LM = models.Q(summary__has_key="causal_lm", summary__causal_lm=True)


class BaseModel(Created):
    """A pretrained model carried into the site and imported from disk: its files in storage,
    each with its sha256 in ``manifest``. ``team`` empty: shared by every team of the site."""

    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.CASCADE, related_name="base_models"
    )
    name = models.CharField(_("name"), max_length=100)
    backend = models.CharField(_("backend"), max_length=16, choices=Backend.choices)
    architecture = models.CharField(max_length=40)
    # What the import found: layers, hidden size, heads, vocabulary size, parameters…
    summary = models.JSONField(default=dict)
    manifest = models.JSONField(default=dict)  # {"files": {path: {"sha256", "size"}}}
    # What its files take in storage (the sizes in ``manifest``), kept for the team's sums.
    stored_bytes = models.BigIntegerField(default=0, editable=False)
    storage_prefix = models.CharField(max_length=255)
    source = models.CharField(max_length=500, blank=True)
    # The pretraining job (objective "mlm") whose result this is; empty for an import.
    job = models.OneToOneField(
        "TrainingJob",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="pretrained_model",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="base_model_name_unique")
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        self.stored_bytes = files_bytes((self.manifest or {}).get("files") or {})
        if kwargs.get("update_fields") is not None:
            kwargs["update_fields"] = {*kwargs["update_fields"], "stored_bytes"}
        super().save(*args, **kwargs)

    @property
    def size_bytes(self) -> int:
        return sum(f["size"] for f in self.manifest.get("files", {}).values())

    @property
    def owner(self) -> str:
        """Whose it is: "team" (its team's own) or "site" (shared with every team by site
        staff); a job by name takes the team's own first."""
        return "site" if self.team_id is None else "team"


class TrainingJob(Created):
    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        RUNNING = "running", _("running")
        SUCCEEDED = "succeeded", _("succeeded")
        FAILED = "failed", _("failed")
        CANCELLED = "cancelled", _("cancelled")

    class Priority(models.IntegerChoices):
        # Celery's priority on Redis: 0 is served first. Top is for the team's owners and site
        # staff (training_job_submit); maintainers choose high at most.
        TOP = 0, _("top")
        HIGH = 2, _("high")
        NORMAL = 5, _("normal")
        LOW = 9, _("low")

    class Objective(models.TextChoices):
        # The task kind's model (a model version), or an encoder pretrained by masked language
        # modelling on the version's texts (a base model named as the job: runtime.mlm).
        TASK = "", _("fine-tune for the task")
        MLM = "mlm", _("pretrain on the texts (masked language modelling)")
        # A trained model version (``parent_version``) compressed: quantized
        # (runtime.compress), or distilled into a preset (runtime.distill).
        INT8 = "int8", _("compress to INT8 (post-training quantization)")
        DISTILL = "distill", _("distill into a smaller model")
        # A large model version (``parent_version``) scored on an evaluation set
        # (runtime.llm_eval): a ModelEvaluation, no model.
        EVALUATE = "evaluate", _("evaluate on an evaluation set")

    ACTIVE = (Status.QUEUED, Status.RUNNING)
    COMPRESSIONS = (Objective.INT8, Objective.DISTILL)  # a model version made from another
    # The objectives that work on a model version (its export fetched for the runner).
    ON_VERSION = (Objective.INT8, Objective.DISTILL, Objective.EVALUATE)

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="training_jobs")
    name = models.CharField(_("name"), max_length=100)
    dataset_version = models.ForeignKey(
        DatasetVersion, on_delete=models.PROTECT, related_name="training_jobs"
    )
    task_kind = models.CharField(max_length=32, choices=KIND_CHOICES)
    labels = models.JSONField(default=list)
    base_model = models.ForeignKey(
        BaseModel, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    preset = models.CharField(max_length=40, blank=True)
    backend = models.CharField(_("backend"), max_length=16, choices=Backend.choices)
    objective = models.CharField(
        _("objective"), max_length=8, choices=Objective.choices, default="", blank=True
    )
    hyperparameters = models.JSONField(default=dict)
    # What a compression job compresses (objective "int8" or "distill").
    parent_version = models.ForeignKey(
        "ModelVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="compression_jobs",
    )
    device_type = models.CharField(_("device"), max_length=16, default="cpu")
    device_count = models.PositiveSmallIntegerField(_("devices"), default=1)
    priority = models.PositiveSmallIntegerField(
        _("priority"), choices=Priority.choices, default=Priority.NORMAL
    )
    # The longest the job may run (from its start), at most TRAINING_MAX_HOURS; its worker stops
    # and fails it past that. Empty (jobs from before the limit): TRAINING_MAX_HOURS.
    max_hours = models.FloatField(_("maximum hours"), null=True, blank=True)
    # The job this one retries or clones.
    origin = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="descendants"
    )
    # A trial of a hyperparameter search (training.sweeps): its number in the sweep, and
    # whether the sweep's pruner stopped it early.
    sweep = models.ForeignKey(
        "Sweep", null=True, blank=True, on_delete=models.SET_NULL, related_name="trials"
    )
    trial_number = models.PositiveSmallIntegerField(null=True, blank=True)
    pruned = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    phase = models.CharField(max_length=16, blank=True)
    # Large models: the rows counted in tokens at submission, and those over the limit.
    data_report = models.JSONField(default=dict, blank=True)
    # Why a queued job waits (team limit, no worker for its device): a console.later message,
    # shown by ``waiting`` in the reader's language.
    waiting_reason = models.TextField(blank=True)
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    attempts = models.PositiveSmallIntegerField(default=0)
    celery_task_id = models.CharField(max_length=64, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    # Where the supervising task runs: a job found running whose process is gone was lost.
    node = models.CharField(max_length=200, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    # The indices of the node's devices the job holds (console.Device); the runner sees only
    # those, through the device type's visibility variable.
    devices = models.JSONField(default=list, blank=True)
    # A job that spans nodes: every node's part, the first this one ([{"node", "devices"}…]),
    # and where their launchers meet (host:port of the first node).
    placement = models.JSONField(default=list, blank=True)
    rendezvous = models.CharField(max_length=200, blank=True)
    step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(default=0)
    epoch = models.PositiveIntegerField(default=0)
    epochs = models.PositiveIntegerField(default=0)
    samples_per_s = models.FloatField(null=True, blank=True)
    eta_s = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # Paused at an epoch's end (its team's device-hour quota used): since when, the seconds it
    # spent paused before (they do not count against max_hours), and its checkpoint and best
    # weights kept in storage under ``resume_prefix`` for whichever node resumes it.
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_s = models.FloatField(default=0)
    resume_files = models.JSONField(default=dict, blank=True)
    first_step_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["team", "status"])]
        verbose_name = _("training job")

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    @property
    def resume_prefix(self) -> str:
        return f"jobs/{self.pk}/resume/"

    @property
    def waiting(self) -> str:
        """Why it waits, in the active language ("" when it does not)."""
        return shown(self.waiting_reason)

    @property
    def progress_percent(self) -> int:
        if self.status == self.Status.SUCCEEDED:
            return 100
        return min(99, int(100 * self.step / self.total_steps)) if self.total_steps else 0

    @property
    def model_source(self) -> str:
        return self.base_model.name if self.base_model_id else self.preset


class TrainingEvent(models.Model):
    """What the runner reported: state, loss, metrics, checkpoints, log lines."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16)
    attempt = models.PositiveSmallIntegerField(default=1)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "kind", "id"])]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind}"


class ModelVersion(Created):
    """A trained (or imported) model: its exported artifact and best checkpoint in storage, the
    evaluation on the test split, and its lineage (dataset version → job → model version)."""

    class Source(models.TextChoices):
        TRAINED = "trained", _("trained")
        IMPORTED = "imported", _("imported")

    id = models.BigAutoField(primary_key=True)
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="model_versions")
    name = models.CharField(_("name"), max_length=100)
    number = models.PositiveIntegerField()
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.TRAINED)
    job = models.OneToOneField(
        TrainingJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="model_version"
    )
    dataset_version = models.ForeignKey(
        DatasetVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="model_versions",
    )
    task_kind = models.CharField(max_length=32, choices=KIND_CHOICES)
    labels = models.JSONField(default=list)
    backend = models.CharField(max_length=16, choices=Backend.choices)
    runtime = models.CharField(max_length=32)
    base = models.CharField(max_length=100, blank=True)  # base model or preset name
    hyperparameters = models.JSONField(default=dict)
    metrics = models.JSONField(default=dict)  # the test split's summary figures
    evaluation = models.JSONField(default=dict)  # the whole report
    manifest = models.JSONField(default=dict)  # the export's manifest.json
    # Where its files are: ``<prefix>export/…``, ``<prefix>checkpoint/…``.
    storage_prefix = models.CharField(max_length=255)
    files = models.JSONField(default=dict)  # {relative path: {"sha256", "size"}}
    # What its files take in storage (the sizes in ``files``), kept for the team's sums.
    stored_bytes = models.BigIntegerField(default=0, editable=False)
    # Lineage as it was where the model was trained, for an imported version.
    provenance = models.JSONField(default=dict, blank=True)
    # A compressed version: the version it was made from, and how (runtime.compress: method,
    # parameters, the deltas, sizes and latencies beside the parent).
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    compression = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name", "-number"]
        verbose_name = _("model version")
        constraints = [
            models.UniqueConstraint(
                fields=["team", "name", "number"], name="model_version_number_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.number}"

    def save(self, *args, **kwargs) -> None:
        self.stored_bytes = files_bytes(self.files)
        if kwargs.get("update_fields") is not None:
            kwargs["update_fields"] = {*kwargs["update_fields"], "stored_bytes"}
        super().save(*args, **kwargs)

    @property
    def baseline_comparison(self) -> dict | None:
        """The model beside the baselines the runner trained on its split (runtime.baselines):
        ``comparison`` (metric, model, baseline, majority, beats_baseline), the classical
        baseline's name, train time and error, and per label the F1 of each. None for a report
        without baselines (an older one, a generative model's). Every page and the API use it."""
        evaluation = self.evaluation or {}
        comparison, baselines = evaluation.get("comparison"), evaluation.get("baselines")
        if not isinstance(comparison, dict) or not isinstance(baselines, dict):
            return None
        classical = baselines.get("classical") or {}
        majority = baselines.get("majority") or {}

        def per_label(entry: dict) -> dict:
            return (entry.get("metrics") or {}).get("per_label") or {}

        ours, theirs, guess = (
            per_label(evaluation),
            per_label(classical),
            per_label(majority),
        )
        return {
            **comparison,
            "baseline_name": classical.get("name", ""),
            "baseline_train_s": classical.get("train_s"),
            "baseline_error": classical.get("error", ""),
            "majority_error": majority.get("error", ""),
            "per_label": [
                {
                    "label": label,
                    "model": ours.get(label, {}).get("f1"),
                    "baseline": theirs.get(label, {}).get("f1"),
                    "majority": guess.get(label, {}).get("f1"),
                    "support": ours.get(label, {}).get("support"),
                }
                for label in dict.fromkeys([*ours, *theirs, *guess])
            ],
        }


def headline_metric(version: "ModelVersion") -> tuple[str, float] | None:
    """The figure of its test split a version is judged by (its kind's primary metric), for
    the lists that show one number a version; None if its report has none."""
    metrics = version.metrics or {}
    names = [PRIMARY_METRICS[version.task_kind]] if version.task_kind in PRIMARY_METRICS else []
    for name in (*names, *GENERATIVE_HEADLINES):
        if isinstance(metrics.get(name), int | float):
            return name, float(metrics[name])
    return None


class Sweep(Created):
    """A hyperparameter search (training.sweeps): ``n_trials`` training jobs over ``space``,
    ``parallel`` of them queued at once, each trial's hyperparameters asked of Optuna, bad
    trials pruned; the best trial's model version is kept, the others' deleted."""

    class Status(models.TextChoices):
        RUNNING = "running", _("running")
        SUCCEEDED = "succeeded", _("succeeded")
        FAILED = "failed", _("failed")
        CANCELLED = "cancelled", _("cancelled")

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="sweeps")
    name = models.CharField(_("name"), max_length=100)
    dataset_version = models.ForeignKey(
        DatasetVersion, on_delete=models.PROTECT, related_name="sweeps"
    )
    backend = models.CharField(_("backend"), max_length=16, choices=Backend.choices)
    base_model = models.CharField(max_length=100, blank=True)  # by name, as jobs are submitted
    preset = models.CharField(max_length=40, blank=True)
    device_type = models.CharField(_("device"), max_length=16, default="cpu")
    n_trials = models.PositiveSmallIntegerField(_("trials"))
    parallel = models.PositiveSmallIntegerField(_("parallel trials"), default=1)
    # Per hyperparameter searched: {"low", "high", "log"} for a number, {"choices": [...]}.
    space = models.JSONField(default=dict)
    # The hyperparameters every trial shares (those not searched).
    hyperparameters = models.JSONField(default=dict, blank=True)
    metric = models.CharField(_("dev metric"), max_length=32, default="macro_f1")
    seed = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    error = models.TextField(blank=True)
    best_job = models.ForeignKey(
        TrainingJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    best_model_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = _("hyperparameter search")

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.RUNNING


class ModelEvaluation(Created):
    """A model version scored on an evaluation set (a dataset version of the kind
    ``evaluation``) by an evaluate job (``training.evaluations``): the figures overall and per
    subject; every question's scores in storage. The set's leaderboard is these."""

    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        RUNNING = "running", _("running")
        DONE = "done", _("done")
        FAILED = "failed", _("failed")

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="model_evaluations")
    # The version scored; for an endpoint, the version its traffic went to (the most of it).
    model_version = models.ForeignKey(
        ModelVersion, on_delete=models.CASCADE, related_name="model_evaluations"
    )
    # An evaluate job's result is made done; an endpoint's is scored by a Celery task.
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DONE)
    # A deployed endpoint scored through its API (deployment.evaluations): its name and id, the
    # adapter called, the versions that served it and their traffic, progress, the error.
    endpoint = models.JSONField(default=dict, blank=True)
    dataset_version = models.ForeignKey(
        DatasetVersion, on_delete=models.CASCADE, related_name="model_evaluations"
    )
    job = models.OneToOneField(
        TrainingJob,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="model_evaluation",
    )
    # runtime.llm_eval's: rows, accuracy_loglik, accuracy_generation, exact_match, rouge_l, bleu.
    metrics = models.JSONField(default=dict)
    subjects = models.JSONField(default=dict, blank=True)  # subject → the same figures
    # Every question's scores (JSON, in storage), and the wrong answers shown on its page.
    items_file = models.CharField(max_length=255, blank=True)
    mistakes = models.JSONField(default=list, blank=True)
    seconds = models.FloatField(null=True, blank=True)
    # Its open questions judged by another endpoint (deployment.judge): the endpoint, the
    # rubric, the status, the figures, and where every judgement is kept.
    judge = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("model evaluation")

    def __str__(self) -> str:
        return f"{self.scored} @ {self.dataset_version}"

    @property
    def scored(self) -> str:
        """What was scored: the version, or the endpoint (and adapter) called."""
        if self.endpoint.get("name"):
            adapter = self.endpoint.get("adapter")
            return self.endpoint["name"] + (f"/{adapter}" if adapter else "")
        return str(self.model_version)
