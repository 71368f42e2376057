from collections.abc import Callable
from typing import TYPE_CHECKING

from django import forms
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from console.hardware import device_choices
from console.models import Team
from console.pickers import SearchSelect, Source
from labeling.models import DatasetVersion
from runtime.data import HEADS, OBJECTIVES
from runtime.kinds import TaskKind
from runtime.presets import DEFAULT_PRESET, FAST_PRESETS, LLM_PRESETS, PRESETS
from training.models import CAUSAL_LM, DEV_METRICS, Backend, BaseModel, TrainingJob

if TYPE_CHECKING:
    from training.jobs import JobPlan

METRIC_LABELS = {
    "macro_f1": _("macro-averaged F1"),
    "micro_f1": _("micro-averaged F1"),
    "weighted_f1": _("weighted F1"),
    "accuracy": _("accuracy"),
}
METRICS = [(m, METRIC_LABELS[m]) for m in DEV_METRICS]


class ModelOrPresetField(forms.ChoiceField):
    """``preset:<name>`` (the presets, listed in full) or ``base:<name>`` (a base model the team
    may use, found by the chooser's search: a site may hold thousands)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(widget=SearchSelect(search_fields=("name",)), **kwargs)
        self.base_models = BaseModel.objects.none()

    def offer(self, presets: list, base_models: QuerySet[BaseModel], team: Team) -> None:
        """Offer ``presets`` and ``base_models``, less the shared ones that a model of the team
        shadows (a job by name takes the team's own first)."""
        shadowed = BaseModel.objects.filter(
            team=team, name=OuterRef("name"), backend=OuterRef("backend")
        )
        self.base_models = base_models.exclude(Q(team__isnull=True) & Exists(shadowed))
        self.choices = presets
        self.widget.source = Source(
            queryset=self.base_models,
            value=lambda m: f"base:{m.name}",
            label=lambda m: (
                f"{m.name} ({m.backend}, "
                + str(_("this team") if m.team_id else _("shared site-wide"))
                + ")"
            ),
            find=lambda v: Q(name=v.removeprefix("base:")) if v.startswith("base:") else None,
            fixed=presets,
            group=str(_("Imported base models")),
        )

    def valid_value(self, value) -> bool:
        if str(value).startswith("base:"):
            return self.base_models.filter(name=str(value).removeprefix("base:")).exists()
        return super().valid_value(value)


class TrainingForm(forms.Form):
    """What a job and a sweep both choose: the team's dataset version (of ``task_kinds``), the
    backend, the model (``preset:<name>`` or ``base:<name>``), the device, the dev metric and a
    name. ``MAIN``: the fields shown first."""

    MAIN: tuple[str, ...] = ()

    # No empty choice: the newest version of the first dataset is chosen until the user picks.
    dataset_version = forms.ModelChoiceField(
        queryset=DatasetVersion.objects.none(),
        label=_("Dataset version"),
        empty_label=None,
        widget=SearchSelect(search_fields=("dataset__name",), number_field="number"),
    )
    backend = forms.ChoiceField(choices=Backend.choices, initial="paddle", label=_("Backend"))
    model = ModelOrPresetField(label=_("Base model or preset"))
    device_type = forms.ChoiceField(choices=device_choices, initial="cpu", label=_("Device"))
    metric = forms.ChoiceField(choices=METRICS, initial="macro_f1", label=_("Dev metric"))
    name = forms.CharField(max_length=100, required=False, label=_("Name"))

    def __init__(self, *args, team, task_kinds: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.team = team
        self.fields["dataset_version"].queryset = (
            DatasetVersion.objects.filter(dataset__team=team, dataset__task_kind__in=task_kinds)
            .select_related("dataset")
            .order_by("dataset__name", "-number")
        )

    def main_fields(self) -> list:
        return [self[name] for name in self.MAIN]

    def model_fields(self) -> dict:
        """The chosen data, backend, model and device, as the job's (or sweep's) fields."""
        data = self.cleaned_data
        kind, _sep, model = data["model"].partition(":")
        return {
            "dataset_version": data["dataset_version"],
            "backend": data["backend"],
            "base_model": model if kind == "base" else "",
            "preset": model if kind == "preset" else "",
            "device_type": data["device_type"],
        }


class JobForm(TrainingForm):
    """A training job. Hyperparameters left empty take the recommended value for the task kind
    and model (presets train from scratch; imported models fine-tune)."""

    DEFAULT_HELP = _(
        "The default: on a CPU, the task kind's fast model (%(fast)s), which trains in minutes "
        "and matches a classical baseline; on an accelerator, the transformer %(transformer)s. "
        "A pretrained model your team imported usually does best of all."
    )
    objective = forms.ChoiceField(
        choices=TrainingJob.Objective.choices,
        required=False,
        initial="",
        label=_("Objective"),
        help_text=_(
            "Pretraining reads every text of the version, labeled or not, and continues a "
            "transformer preset or an imported encoder as a masked language model; its result "
            "is a base model of the team, named as the job (default: <dataset>-dapt), that "
            "later jobs fine-tune."
        ),
    )
    device_count = forms.IntegerField(min_value=1, initial=1, label=_("Devices"))
    priority = forms.TypedChoiceField(
        choices=TrainingJob.Priority.choices, coerce=int, initial=5, label=_("Priority")
    )
    max_hours = forms.FloatField(
        min_value=0.001,
        required=False,
        label=_("Maximum hours"),
        help_text=_("Empty: the site's limit (TRAINING_MAX_HOURS)."),
    )
    epochs = forms.IntegerField(
        min_value=1,
        required=False,
        label=_("Epochs"),
        help_text=_("Passes over the training split; early stopping may end sooner."),
    )
    batch_size = forms.IntegerField(
        min_value=1,
        required=False,
        label=_("Batch size"),
        help_text=_("Rows per step; larger is faster per row and needs more memory."),
    )
    learning_rate = forms.FloatField(
        required=False,
        label=_("Learning rate"),
        help_text=_("The optimiser's step size; the most telling setting."),
    )
    max_seq_length = forms.IntegerField(
        required=False,
        label=_("Max sequence length"),
        help_text=_("Tokens a row is cut to; longer texts are read in overlapping windows."),
    )
    warmup_ratio = forms.FloatField(
        required=False,
        label=_("Warm-up ratio"),
        help_text=_("The share of steps in which the learning rate rises from zero."),
    )
    weight_decay = forms.FloatField(
        required=False,
        label=_("Weight decay"),
        help_text=_("Pulls weights towards zero against overfitting."),
    )
    seed = forms.IntegerField(
        required=False,
        label=_("Seed"),
        help_text=_("The same seed, data and settings train the same model."),
    )
    early_stopping_patience = forms.IntegerField(
        min_value=0,
        required=False,
        label=_("Early stopping patience (evaluations)"),
        help_text=_(
            "Training stops when the dev metric has not improved for this many epochs (3 "
            "unless set); 0: never."
        ),
    )
    max_minutes = forms.FloatField(
        min_value=0,
        required=False,
        label=_("Time budget (minutes)"),
        help_text=_(
            "Empty or 0: none. The runner measures its speed, trains the epochs that fit and "
            "exports the best checkpoint."
        ),
    )
    threshold = forms.FloatField(
        required=False,
        label=_("Multi-label threshold"),
        help_text=_("A label is predicted from this probability on."),
    )
    dropout = forms.FloatField(
        required=False,
        label=_("Dropout"),
        help_text=_("The share of units dropped while training, against overfitting."),
    )
    # Large models (instruction and preference data).
    method = forms.ChoiceField(
        choices=[("", _("recommended")), ("lora", "LoRA"), ("full", _("full fine-tuning"))],
        required=False,
        label=_("Method"),
        help_text=_("LoRA trains small adapters on the frozen model; full trains every weight."),
    )
    lora_rank = forms.IntegerField(
        min_value=1,
        required=False,
        label=_("LoRA rank"),
        help_text=_("The adapters' width: more can learn more and takes more memory."),
    )
    lora_alpha = forms.IntegerField(
        min_value=1,
        required=False,
        label=_("LoRA alpha"),
        help_text=_("Scales the adapters' output (alpha / rank); usually twice the rank."),
    )
    lora_dropout = forms.FloatField(
        required=False,
        label=_("LoRA dropout"),
        help_text=_("Dropout on the adapters' input."),
    )
    lora_target_modules = forms.CharField(
        required=False,
        label=_("LoRA target modules"),
        help_text=_("Comma-separated layer names; empty: the architecture's default."),
    )
    gradient_accumulation_steps = forms.IntegerField(
        min_value=1,
        required=False,
        label=_("Gradient accumulation steps"),
        help_text=_("Batches added up before a step: a larger batch in the same memory."),
    )
    recompute = forms.BooleanField(
        required=False,
        label=_("Recompute activations"),
        help_text=_("Less memory for about a third more time."),
    )
    packing = forms.BooleanField(
        required=False,
        label=_("Pack conversations"),
        help_text=_("Several short conversations per sequence: faster on short rows."),
    )
    dpo_beta = forms.FloatField(
        required=False,
        label=_("DPO beta"),
        help_text=_("How far the tuned model may move from the base; lower moves further."),
    )
    max_new_tokens = forms.IntegerField(
        min_value=1,
        required=False,
        label=_("New tokens per evaluation generation"),
        help_text=_("The length of the answers the report shows for held-out prompts."),
    )
    min_rating = forms.IntegerField(
        min_value=0,
        max_value=5,
        required=False,
        label=_("Minimum rating"),
        help_text=_("Instruction rows rated lower by annotators do not train; 0: all."),
    )

    LLM_HYPERPARAMETERS = (
        "method",
        "lora_rank",
        "lora_alpha",
        "lora_dropout",
        "lora_target_modules",
        "gradient_accumulation_steps",
        "recompute",
        "packing",
        "dpo_beta",
        "max_new_tokens",
        "min_rating",
    )
    HYPERPARAMETERS = (
        "epochs",
        "batch_size",
        "learning_rate",
        "max_seq_length",
        "warmup_ratio",
        "weight_decay",
        "seed",
        "early_stopping_patience",
        "max_minutes",
        "metric",
        "threshold",
        "dropout",
    )

    def __init__(self, *args, team, base_models, top_priority: bool = True, **kwargs) -> None:
        super().__init__(*args, team=team, task_kinds=[*HEADS, *OBJECTIVES], **kwargs)
        if not top_priority:  # the team's owners and site staff only
            self.fields["priority"].choices = [
                c for c in TrainingJob.Priority.choices if c[0] != TrainingJob.Priority.TOP
            ]
        self.fields["model"].offer(
            [
                ("preset:", _("Default for the task kind and device")),
                (
                    _("Fast presets (CPU)"),
                    [
                        (f"preset:{p}", f"{p} ({', '.join(c['kinds'])})")
                        for p, c in FAST_PRESETS.items()
                    ],
                ),
                (_("Presets"), [(f"preset:{p}", p) for p in PRESETS]),
                (_("Presets of large models"), [(f"preset:{p}", p) for p in LLM_PRESETS]),
            ],
            base_models,
            team,
        )
        self.fields["model"].help_text = self.DEFAULT_HELP % {
            "fast": ", ".join(FAST_PRESETS),
            "transformer": DEFAULT_PRESET,
        }
        # A pretrained encoder the team imported is the better start: offered first.
        own = (
            base_models.filter(team=team, backend=self.fields["backend"].initial)
            .exclude(CAUSAL_LM)
            .first()
        )
        if own and not self.is_bound:
            self.initial.setdefault("model", f"base:{own.name}")
            self.fields["model"].help_text = _(
                "%(name)s, the pretrained model your team imported, is chosen: fine-tuning it "
                "usually beats a model trained from scratch. %(default)s"
            ) % {"name": own.name, "default": self.fields["model"].help_text}

    MAIN = (
        "dataset_version",
        "backend",
        "model",
        "objective",
        "device_type",
        "device_count",
        "priority",
        "max_hours",
        "name",
    )

    def hyperparameter_fields(self) -> list:
        return [self[name] for name in self.HYPERPARAMETERS]

    # What a job's plan asks of each field that only some jobs use; the others always apply.
    ONLY_FOR: dict[str, Callable[["JobPlan", dict], bool]] = {
        "objective": lambda plan, data: not plan.generative,
        "metric": lambda plan, data: not plan.generative and not plan.pretrain,
        "threshold": lambda plan, data: plan.kind == TaskKind.MULTI_LABEL,
        "dropout": lambda plan, data: not plan.generative,
        "method": lambda plan, data: plan.generative,
        "lora_rank": lambda plan, data: plan.generative and data["method"] == "lora",
        "lora_alpha": lambda plan, data: plan.generative and data["method"] == "lora",
        "lora_dropout": lambda plan, data: plan.generative and data["method"] == "lora",
        "lora_target_modules": lambda plan, data: plan.generative and data["method"] == "lora",
        "gradient_accumulation_steps": lambda plan, data: plan.generative,
        "recompute": lambda plan, data: plan.generative,
        "packing": lambda plan, data: plan.kind == TaskKind.INSTRUCTION,
        "min_rating": lambda plan, data: plan.kind == TaskKind.INSTRUCTION,
        "dpo_beta": lambda plan, data: plan.kind == TaskKind.PREFERENCE,
        "max_new_tokens": lambda plan, data: plan.generative,
    }

    def plan_choices(self) -> dict | None:
        """The choices ``job_plan`` takes, as entered (a bound form's valid ones) or as the page
        offers them; None until a dataset version is chosen."""
        if self.is_bound:
            data = getattr(self, "cleaned_data", {})
            if not {"dataset_version", "backend", "model", "device_type"} <= data.keys():
                return None
            return {
                **self.model_fields(),
                "device_count": data.get("device_count") or 1,
                "objective": data.get("objective") or "",
                "name": data.get("name") or "",
            }
        version = self.initial.get("dataset_version") or self.fields["dataset_version"].initial
        versions = self.fields["dataset_version"].queryset
        version = (
            versions.filter(pk=version).first() if str(version).isdigit() else versions.first()
        )
        if version is None:
            return None
        kind, _sep, model = str(self.initial.get("model") or "preset:").partition(":")
        return {
            "dataset_version": version,
            "backend": self.initial.get("backend") or self.fields["backend"].initial,
            "base_model": model if kind == "base" else "",
            "preset": model if kind == "preset" else "",
            "device_type": self.initial.get("device_type") or self.fields["device_type"].initial,
            "device_count": self.initial.get("device_count") or 1,
            "objective": self.initial.get("objective") or "",
            "name": "",
        }

    def guide(self, plan: "JobPlan") -> None:
        """Fit the form to ``plan``: each hyperparameter's recommended value as its placeholder,
        and the fields its kind and method do not use hidden (their values kept)."""
        method = (self.data.get("method") if self.is_bound else "") or plan.recommended["method"]
        self.hidden = {
            name for name, applies in self.ONLY_FOR.items() if not applies(plan, {"method": method})
        }
        for name in (*self.HYPERPARAMETERS, *self.LLM_HYPERPARAMETERS):
            value = plan.recommended.get(name)
            if isinstance(value, bool | list) or value is None or name == "method":
                continue
            self.fields[name].widget.attrs["placeholder"] = (
                f"{value:g}" if isinstance(value, float) else str(value)
            )

    hidden: frozenset[str] | set[str] = frozenset()  # guide() sets the job's own

    def llm_fields(self) -> list:
        return [self[name] for name in self.LLM_HYPERPARAMETERS]

    def job_fields(self) -> dict:
        data = self.cleaned_data
        hyperparameters = {
            k: data[k] for k in self.HYPERPARAMETERS if data.get(k) not in (None, "")
        }
        for k in self.LLM_HYPERPARAMETERS:
            value = data.get(k)
            if k == "lora_target_modules":
                value = [m.strip() for m in (value or "").split(",") if m.strip()] or None
            if value not in (None, "", False):
                hyperparameters[k] = value
        return {
            **self.model_fields(),
            "device_count": data["device_count"],
            "priority": data["priority"],
            "max_hours": data.get("max_hours"),
            "name": data["name"],
            "objective": data.get("objective") or "",
            "hyperparameters": hyperparameters,
        }


class BaseModelImportForm(forms.Form):
    name = forms.CharField(max_length=100, label=_("Name"))
    backend = forms.ChoiceField(choices=Backend.choices, initial="paddle", label=_("Backend"))
    path = forms.CharField(
        required=False,
        label=_("Directory or archive on the server"),
        help_text=_("Relative to the import directory."),
    )
    archive = forms.FileField(required=False, label=_("Or upload an archive (.tar.gz, .zip)"))
    shared = forms.BooleanField(
        required=False,
        label=_("Share with every team of this site"),
        help_text=_("Site staff only. A team's own model of the same name still comes first."),
    )

    def __init__(self, *args, can_share: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not can_share:
            del self.fields["shared"]


class ModelImportForm(forms.Form):
    archive = forms.FileField(label=_("Model version archive (.tar.gz)"))


class SweepForm(TrainingForm):
    """A hyperparameter search: the trials' data, model and device, and per hyperparameter a
    tick, then a range (low, high, logarithmic) or a list of choices."""

    # name: (low, high, log, choices) offered at first.
    SEARCH_DEFAULTS = {
        "learning_rate": (1e-4, 1e-2, True, ""),
        "batch_size": (None, None, False, "16, 32, 64"),
        "dropout": (0.0, 0.3, False, ""),
        "weight_decay": (0.0, 0.1, False, ""),
        "epochs": (2, 10, False, ""),
        "warmup_ratio": (0.0, 0.2, False, ""),
        "max_seq_length": (None, None, False, "64, 128, 256"),
    }
    SEARCH_LABELS = {
        "learning_rate": _("Learning rate"),
        "batch_size": _("Batch size"),
        "dropout": _("Dropout"),
        "weight_decay": _("Weight decay"),
        "epochs": _("Epochs"),
        "warmup_ratio": _("Warm-up ratio"),
        "max_seq_length": _("Max sequence length"),
    }

    n_trials = forms.IntegerField(min_value=2, initial=10, label=_("Trials"))
    parallel = forms.IntegerField(
        min_value=1,
        initial=1,
        label=_("Trials in parallel"),
        help_text=_("Queued at once; they run where devices are free."),
    )

    def __init__(self, *args, team, base_models, **kwargs) -> None:
        super().__init__(*args, team=team, task_kinds=list(HEADS), **kwargs)
        self.fields["model"].offer(
            [
                ("preset:", _("Default for the task kind and device")),
                (_("Fast presets (CPU)"), [(f"preset:{p}", p) for p in FAST_PRESETS]),
                (_("Presets"), [(f"preset:{p}", p) for p in PRESETS]),
            ],
            base_models.exclude(CAUSAL_LM),
            team,
        )
        for name, (low, high, log, choices) in self.SEARCH_DEFAULTS.items():
            self.fields[f"search_{name}"] = forms.BooleanField(
                required=False, label=self.SEARCH_LABELS[name]
            )
            what = self.SEARCH_LABELS[name]
            # Each control named with its hyperparameter: the table's columns alone do not.
            for suffix, field in (
                ("low", forms.FloatField(required=False, initial=low, label=_("low"))),
                ("high", forms.FloatField(required=False, initial=high, label=_("high"))),
                ("log", forms.BooleanField(required=False, initial=log, label=_("logarithmic"))),
                (
                    "choices",
                    forms.CharField(
                        required=False,
                        initial=choices,
                        label=_("or choices"),
                        help_text=_("Comma-separated; instead of a range."),
                    ),
                ),
            ):
                field.widget.attrs["aria-label"] = format_lazy("{}: {}", what, field.label)
                self.fields[f"{name}_{suffix}"] = field

    MAIN = (
        "dataset_version",
        "backend",
        "model",
        "device_type",
        "n_trials",
        "parallel",
        "metric",
        "name",
    )

    def search_rows(self) -> list[dict]:
        return [
            {
                "name": name,
                "tick": self[f"search_{name}"],
                "low": self[f"{name}_low"],
                "high": self[f"{name}_high"],
                "log": self[f"{name}_log"],
                "choices": self[f"{name}_choices"],
            }
            for name in self.SEARCH_DEFAULTS
        ]

    def clean(self) -> dict:
        data = super().clean()
        space: dict[str, dict] = {}
        for name in self.SEARCH_DEFAULTS:
            if not data.get(f"search_{name}"):
                continue
            choices = [c.strip() for c in (data.get(f"{name}_choices") or "").split(",")]
            if any(choices):
                space[name] = {"choices": [c for c in choices if c]}
            else:
                space[name] = {
                    "low": data.get(f"{name}_low"),
                    "high": data.get(f"{name}_high"),
                    "log": bool(data.get(f"{name}_log")),
                }
        if not space:
            raise forms.ValidationError(_("Tick at least one hyperparameter to search."))
        data["space"] = space
        return data

    def sweep_fields(self) -> dict:
        data = self.cleaned_data
        return {
            **self.model_fields(),
            "n_trials": data["n_trials"],
            "parallel": data["parallel"],
            "metric": data["metric"],
            "name": data["name"],
            "space": data["space"],
        }
