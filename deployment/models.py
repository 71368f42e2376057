"""Endpoints, their revisions and API keys (the desired state), the serving hosts and what
each holds (the observed state), and request metrics scraped from the hosts."""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from console.models import Created, HashedKey, Team
from runtime.kinds import GENERATIVE_KINDS
from training.models import ModelVersion

# An endpoint's cap on a generated reply's tokens: its default and the largest it may be.
MAX_TOKENS_DEFAULT = 1024
MAX_TOKENS_LIMIT = 32768
# The smallest rate limit of a key or an adapter (requests per second).
MIN_RATE_PER_S = 0.01


class ServingHost(models.Model):
    """A serving host the platform knows (``SERVING_HOSTS``) and what it last reported."""

    url = models.URLField(unique=True)
    devices = models.JSONField(default=list)
    reachable = models.BooleanField(default=False)
    boot_id = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # The host's cumulative counters at the last scrape: the next one stores the difference.
    metrics_boot_id = models.CharField(max_length=64, blank=True)
    metrics_snapshot = models.JSONField(default=dict, blank=True)
    metrics_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["url"]

    def __str__(self) -> str:
        return self.url


class Endpoint(Created):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="endpoints")
    # The name in the inference URL (/v1/endpoints/<name>:predict), unique on the site.
    name = models.SlugField(_("name"), max_length=60, unique=True)
    description = models.CharField(_("description"), max_length=200, blank=True)
    task_kind = models.CharField(max_length=32)
    # The last good revision: rollback returns all traffic to it.
    stable_revision = models.ForeignKey(
        "Revision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    max_inputs = models.PositiveIntegerField(
        _("inputs per request"),
        default=64,
        validators=[MinValueValidator(1), MaxValueValidator(256)],
    )
    # Generative endpoints: a reply's tokens at most; a request asking more is capped to it.
    max_tokens = models.PositiveIntegerField(
        _("tokens per reply"),
        default=MAX_TOKENS_DEFAULT,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_TOKENS_LIMIT)],
    )

    class Meta:
        ordering = ["name"]
        verbose_name = _("endpoint")

    def __str__(self) -> str:
        return self.name

    @property
    def inference_url(self) -> str:
        """Where applications send their requests: OpenAI's chat completions for a generative
        model (``model`` names the endpoint), the predict route otherwise."""
        if self.task_kind in GENERATIVE_KINDS:
            return f"{settings.SERVING_PUBLIC_URL}/v1/chat/completions"
        return f"{settings.SERVING_PUBLIC_URL}/v1/endpoints/{self.name}:predict"


class Revision(Created):
    """A model version behind an endpoint, with its share of the traffic and how it runs."""

    class Status(models.TextChoices):
        ACTIVE = "active", _("active")
        RETIRED = "retired", _("retired")

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    model_version = models.ForeignKey(
        ModelVersion, on_delete=models.CASCADE, related_name="revisions"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    weight = models.PositiveSmallIntegerField(
        _("traffic %"), default=100, validators=[MaxValueValidator(100)]
    )
    replicas = models.PositiveSmallIntegerField(
        _("replicas"), default=1, validators=[MinValueValidator(1), MaxValueValidator(16)]
    )
    device_type = models.CharField(_("device type"), max_length=16, default="cpu")
    max_batch_size = models.PositiveSmallIntegerField(
        _("max batch size"), default=32, validators=[MinValueValidator(1), MaxValueValidator(256)]
    )
    max_wait_ms = models.FloatField(
        _("max wait (ms)"), default=5.0, validators=[MinValueValidator(0), MaxValueValidator(1000)]
    )
    # "builtin": the platform's own processes; or an LLM engine of the node (vLLM, FastDeploy).
    engine = models.CharField(_("engine"), max_length=32, default="builtin")
    # The stable revision this one replaced when it was promoted: a rollback returns to it.
    replaced = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    promoted_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["endpoint", "number"]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "number"], name="revision_number_unique")
        ]

    def __str__(self) -> str:
        return f"{self.endpoint.name} #{self.number}"

    @property
    def key(self) -> str:
        """Its name on the serving hosts."""
        return f"rev-{self.pk}"

    @staticmethod
    def pk_from_key(key: str) -> int | None:
        """The pk of the revision a host names ``key``; None for a name that is no revision's."""
        prefix, _sep, pk = key.partition("-")
        return int(pk) if prefix == "rev" and pk.isdigit() else None


class EndpointAdapter(Created):
    """A LoRA adapter a generative endpoint serves over its model: a LoRA version fine-tuned
    from the same base model, called as ``model="<endpoint>/<name>"`` (``deployment.adapters``
    says which versions fit)."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="adapters")
    # Its name in OpenAI's ``model`` field (runtime.adapters.NAME).
    name = models.SlugField(_("name"), max_length=60)
    model_version = models.ForeignKey(
        ModelVersion, on_delete=models.CASCADE, related_name="adapter_of"
    )
    # Requests per second to it over all keys (per serving host); empty: no limit.
    rate_per_s = models.FloatField(
        _("rate limit (requests/s)"),
        null=True,
        blank=True,
        validators=[MinValueValidator(MIN_RATE_PER_S)],
    )

    class Meta:
        ordering = ["endpoint", "name"]
        verbose_name = _("adapter")
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "name"], name="adapter_name_unique")
        ]

    def __str__(self) -> str:
        return f"{self.endpoint.name}/{self.name}"


class Placement(models.Model):
    """What a serving host last said of a revision it should hold (or held)."""

    class State(models.TextChoices):
        LOADING = "loading", _("loading")
        READY = "ready", _("ready")
        FAILED = "failed", _("failed")
        MISSING = "missing", _("not loaded")

    revision = models.ForeignKey(Revision, on_delete=models.CASCADE, related_name="placements")
    host = models.ForeignKey(ServingHost, on_delete=models.CASCADE, related_name="placements")
    state = models.CharField(max_length=16, choices=State.choices, default=State.MISSING)
    error = models.TextField(blank=True)
    replicas_ready = models.PositiveSmallIntegerField(default=0)
    # Its adapters there: name → {"state", "error", "bytes"}.
    adapters = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["revision", "host"], name="one_placement_per_host")
        ]

    def __str__(self) -> str:
        return f"{self.revision} on {self.host}: {self.state}"


class EndpointKey(HashedKey):
    """An API key of one endpoint, sent by applications (``Authorization: Bearer mpe_…``)."""

    KEY_PREFIX = "mpe_"  # told apart from personal tokens (mp_)

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="keys")
    # Requests per second this key may send (per serving host); empty: no limit.
    rate_per_s = models.FloatField(
        _("rate limit (requests/s)"),
        null=True,
        blank=True,
        validators=[MinValueValidator(MIN_RATE_PER_S)],
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The adapters (names) it may call, and only those; empty: the endpoint's model and all.
    adapters = models.JSONField(default=list, blank=True)

    class Meta(HashedKey.Meta):
        pass


class MetricSample(models.Model):
    """Requests of one endpoint (and revision) on one host between two scrapes."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="samples")
    revision = models.ForeignKey(
        Revision, null=True, blank=True, on_delete=models.CASCADE, related_name="samples"
    )
    # Generative endpoints: the adapter the requests named ("" for the endpoint's model).
    adapter = models.CharField(max_length=60, blank=True, default="")
    host = models.ForeignKey(ServingHost, null=True, on_delete=models.SET_NULL, related_name="+")
    at = models.DateTimeField(db_index=True)
    window_s = models.FloatField()
    requests = models.PositiveIntegerField(default=0)
    inputs = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    client_errors = models.PositiveIntegerField(default=0)
    unauthorized = models.PositiveIntegerField(default=0)
    rate_limited = models.PositiveIntegerField(default=0)
    # Generative endpoints: tokens read and written, and the time to the first token.
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency = models.JSONField(default=list)  # counts per bucket of serving.metrics
    ttft = models.JSONField(default=list)

    class Meta:
        ordering = ["at"]
        indexes = [models.Index(fields=["endpoint", "at"])]

    def __str__(self) -> str:
        return f"{self.endpoint} {self.at:%H:%M:%S} {self.requests}"


class EndpointUsage(models.Model):
    """An endpoint's (or one of its adapters') requests and tokens in a calendar month, added
    up as the metrics are scraped (deployment/metrics.py): what usage accounting and
    chargeback read. Kept after the samples are pruned and after the endpoint is deleted."""

    # No database constraints: the metrics' scrape takes no lock on the team's or endpoint's
    # row, which a deployment holds (their deletion is Django's SET_NULL all the same).
    team = models.ForeignKey(
        Team, null=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False
    )
    team_name = models.CharField(max_length=100)
    endpoint = models.ForeignKey(
        Endpoint, null=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False
    )
    endpoint_name = models.CharField(max_length=60)
    adapter = models.CharField(max_length=60, blank=True, default="")
    month = models.DateField()  # its first day
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["month", "endpoint_name", "adapter"]
        constraints = [
            models.UniqueConstraint(
                fields=["team_name", "endpoint_name", "adapter", "month"],
                name="one_usage_row_per_endpoint_month",
            )
        ]

    def __str__(self) -> str:
        return f"{self.endpoint_name} {self.month:%Y-%m}"
