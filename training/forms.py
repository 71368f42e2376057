from django import forms
from django.utils.translation import gettext_lazy as _

from console.hardware import device_choices
from labeling.models import DatasetVersion
from runtime.data import HEADS, OBJECTIVES
from runtime.presets import LLM_PRESETS, PRESETS
from training.models import Backend, TrainingJob

METRICS = [(m, m) for m in ("macro_f1", "micro_f1", "weighted_f1", "accuracy")]


class JobForm(forms.Form):
    """A training job. Hyperparameters left empty take the recommended value for the task kind
    and model (presets train from scratch; imported models fine-tune)."""

    # No empty choice: the newest version of the first dataset is chosen until the user picks.
    dataset_version = forms.ModelChoiceField(
        queryset=DatasetVersion.objects.none(), label=_("Dataset version"), empty_label=None
    )
    backend = forms.ChoiceField(choices=Backend.choices, initial="paddle", label=_("Backend"))
    model = forms.ChoiceField(label=_("Base model or preset"))
    device_type = forms.ChoiceField(choices=device_choices, initial="cpu", label=_("Device"))
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
    name = forms.CharField(max_length=100, required=False, label=_("Name"))
    epochs = forms.IntegerField(min_value=1, required=False, label=_("Epochs"))
    batch_size = forms.IntegerField(min_value=1, required=False, label=_("Batch size"))
    learning_rate = forms.FloatField(required=False, label=_("Learning rate"))
    max_seq_length = forms.IntegerField(required=False, label=_("Max sequence length"))
    warmup_ratio = forms.FloatField(required=False, label=_("Warm-up ratio"))
    weight_decay = forms.FloatField(required=False, label=_("Weight decay"))
    seed = forms.IntegerField(required=False, label=_("Seed"))
    early_stopping_patience = forms.IntegerField(
        min_value=0, required=False, label=_("Early stopping patience (evaluations)")
    )
    metric = forms.ChoiceField(choices=METRICS, initial="macro_f1", label=_("Dev metric"))
    threshold = forms.FloatField(required=False, label=_("Multi-label threshold"))
    dropout = forms.FloatField(required=False, label=_("Dropout"))
    # Large models (instruction and preference data).
    method = forms.ChoiceField(
        choices=[("", _("recommended")), ("lora", "LoRA"), ("full", _("full fine-tuning"))],
        required=False,
        label=_("Method"),
    )
    lora_rank = forms.IntegerField(min_value=1, required=False, label=_("LoRA rank"))
    lora_alpha = forms.IntegerField(min_value=1, required=False, label=_("LoRA alpha"))
    lora_dropout = forms.FloatField(required=False, label=_("LoRA dropout"))
    lora_target_modules = forms.CharField(
        required=False,
        label=_("LoRA target modules"),
        help_text=_("Comma-separated layer names; empty: the architecture's default."),
    )
    gradient_accumulation_steps = forms.IntegerField(
        min_value=1, required=False, label=_("Gradient accumulation steps")
    )
    recompute = forms.BooleanField(required=False, label=_("Recompute activations"))
    packing = forms.BooleanField(required=False, label=_("Pack conversations"))
    dpo_beta = forms.FloatField(required=False, label=_("DPO beta"))
    max_new_tokens = forms.IntegerField(
        min_value=1, required=False, label=_("New tokens per evaluation generation")
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
        "metric",
        "threshold",
        "dropout",
    )

    def __init__(self, *args, team, base_models, top_priority: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not top_priority:  # the team's owners and site staff only
            self.fields["priority"].choices = [
                c for c in TrainingJob.Priority.choices if c[0] != TrainingJob.Priority.TOP
            ]
        # A job by name takes the team's own model first: a shared one it shadows is not offered.
        own = {(m.name, m.backend) for m in base_models if m.team_id is not None}
        base_models = [
            m for m in base_models if m.team_id is not None or (m.name, m.backend) not in own
        ]
        self.fields["dataset_version"].queryset = (
            DatasetVersion.objects.filter(
                dataset__team=team, dataset__task_kind__in=[*HEADS, *OBJECTIVES]
            )
            .select_related("dataset")
            .order_by("dataset__name", "-number")
        )
        self.fields["model"].choices = [
            ("preset:", _("The task kind's default preset")),
            (_("Presets"), [(f"preset:{p}", p) for p in PRESETS]),
            (_("Presets of large models"), [(f"preset:{p}", p) for p in LLM_PRESETS]),
            (
                _("Imported base models"),
                [
                    (
                        f"base:{m.name}",
                        f"{m.name} ({m.backend}, "
                        + str(_("this team") if m.team_id else _("shared site-wide"))
                        + ")",
                    )
                    for m in base_models
                ],
            ),
        ]

    MAIN = (
        "dataset_version",
        "backend",
        "model",
        "device_type",
        "device_count",
        "priority",
        "max_hours",
        "name",
    )

    def main_fields(self) -> list:
        return [self[name] for name in self.MAIN]

    def hyperparameter_fields(self) -> list:
        return [self[name] for name in self.HYPERPARAMETERS]

    def llm_fields(self) -> list:
        return [self[name] for name in self.LLM_HYPERPARAMETERS]

    def job_fields(self) -> dict:
        data = self.cleaned_data
        kind, _sep, model = data["model"].partition(":")
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
            "dataset_version": data["dataset_version"],
            "backend": data["backend"],
            "base_model": model if kind == "base" else "",
            "preset": model if kind == "preset" else "",
            "device_type": data["device_type"],
            "device_count": data["device_count"],
            "priority": data["priority"],
            "max_hours": data.get("max_hours"),
            "name": data["name"],
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
