from django import forms
from django.utils.translation import gettext_lazy as _

from console.hardware import device_choices
from console.pickers import SearchSelect
from console.services import KEY_MAX_DAYS
from deployment.models import MAX_TOKENS_DEFAULT, MAX_TOKENS_LIMIT
from serving.engines import BUILTIN, ENGINES
from training.models import ModelVersion


class KnobsForm(forms.Form):
    device_type = forms.ChoiceField(choices=device_choices, initial="cpu", label=_("Device"))
    replicas = forms.IntegerField(min_value=1, max_value=16, initial=1, label=_("Replicas"))
    max_batch_size = forms.IntegerField(
        min_value=1, max_value=256, initial=32, label=_("Max batch size")
    )
    max_wait_ms = forms.FloatField(
        min_value=0, max_value=1000, initial=5.0, label=_("Max wait (ms)")
    )
    engine = forms.ChoiceField(
        choices=[(BUILTIN, _("the platform's own")), *((e, e) for e in ENGINES)],
        initial=BUILTIN,
        required=False,
        label=_("Engine"),
        help_text=_("Large models only: an LLM engine installed on the serving hosts."),
    )

    def clean_engine(self) -> str:
        return self.cleaned_data.get("engine") or BUILTIN


class DeployForm(KnobsForm):
    model_version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.none(),
        label=_("Model version"),
        empty_label=None,
        widget=SearchSelect(search_fields=("name",), number_field="number"),
    )
    name = forms.SlugField(
        max_length=60,
        required=False,
        label=_("Endpoint name"),
        help_text=_("Lower-case letters, digits and hyphens; empty: from the model's name."),
    )
    description = forms.CharField(max_length=200, required=False, label=_("Description"))
    max_inputs = forms.IntegerField(
        min_value=1, max_value=256, initial=64, label=_("Inputs per request")
    )
    max_tokens = forms.IntegerField(
        min_value=1,
        max_value=MAX_TOKENS_LIMIT,
        initial=MAX_TOKENS_DEFAULT,
        label=_("Tokens per reply"),
        help_text=_("Chat models: a reply's tokens at most; a request asking more gets this many."),
        required=False,
    )
    field_order = ["model_version", "name", "description"]

    def clean_max_tokens(self) -> int:
        return self.cleaned_data.get("max_tokens") or MAX_TOKENS_DEFAULT

    def __init__(self, *args, team, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["model_version"].queryset = ModelVersion.objects.filter(team=team).order_by(
            "-created_at"
        )


class CanaryForm(KnobsForm):
    model_version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.none(),
        label=_("Model version"),
        empty_label=None,
        widget=SearchSelect(search_fields=("name",), number_field="number"),
    )
    weight = forms.IntegerField(min_value=0, max_value=100, initial=10, label=_("Traffic %"))
    field_order = ["model_version", "weight"]

    def __init__(self, *args, endpoint, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["model_version"].queryset = ModelVersion.objects.filter(
            team=endpoint.team, task_kind=endpoint.task_kind
        ).order_by("-created_at")


class KeyForm(forms.Form):
    name = forms.CharField(max_length=100, label=_("Key name"))
    adapters = forms.MultipleChoiceField(
        choices=[],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label=_("Only these adapters"),
        help_text=_("None ticked: the endpoint's model and every adapter."),
    )
    rate_per_s = forms.FloatField(
        min_value=0.01,
        required=False,
        label=_("Rate limit (requests/s)"),
        help_text=_("Empty: no limit."),
    )
    expires_in_days = forms.IntegerField(
        min_value=1,
        max_value=KEY_MAX_DAYS,
        required=False,
        label=_("Expires in (days)"),
        help_text=_("Empty: never."),
    )

    def __init__(self, *args, adapters: list[str] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if adapters:
            self.fields["adapters"].choices = [(n, n) for n in adapters]
        else:
            del self.fields["adapters"]


class AdapterForm(forms.Form):
    name = forms.SlugField(max_length=60, label=_("Adapter name"))
    model_version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.none(), label=_("LoRA model version"), empty_label=None
    )
    rate_per_s = forms.FloatField(
        min_value=0.01,
        required=False,
        label=_("Rate limit (requests/s)"),
        help_text=_("Over all keys. Empty: no limit."),
    )

    def __init__(self, *args, versions: list[ModelVersion], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["model_version"].queryset = ModelVersion.objects.filter(
            pk__in=[v.pk for v in versions]
        ).order_by("-created_at")


class JudgeForm(forms.Form):
    endpoint = forms.ModelChoiceField(
        queryset=None,
        label=_("Judge endpoint"),
        empty_label=None,
        widget=SearchSelect(search_fields=("name", "description")),
    )
    rubric = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8}),
        label=_("Rubric"),
        help_text=_(
            "{question}, {reference} and {answer} are replaced by each open question's text; "
            "the judge answers with 分数：1–5 and 理由：…"
        ),
    )

    def __init__(self, *args, endpoints, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["endpoint"].queryset = endpoints


class PreannotateForm(forms.Form):
    endpoint = forms.ModelChoiceField(
        queryset=None,
        label=_("Endpoint"),
        empty_label=None,
        widget=SearchSelect(search_fields=("name", "description")),
    )

    def __init__(self, *args, endpoints, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["endpoint"].queryset = endpoints


class EndpointEvaluateForm(forms.Form):
    evaluation_set = forms.ModelChoiceField(
        queryset=None,
        label=_("Evaluation set"),
        empty_label=None,
        widget=SearchSelect(search_fields=("dataset__name",), number_field="number"),
    )
    adapter = forms.ChoiceField(label=_("Called as"), required=False)
    max_new_tokens = forms.IntegerField(
        min_value=1, max_value=1024, initial=64, label=_("New tokens")
    )

    def __init__(self, *args, endpoint, evaluation_sets, adapters: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["evaluation_set"].queryset = evaluation_sets
        self.fields["adapter"].choices = [("", endpoint.name)] + [
            (a, f"{endpoint.name}/{a}") for a in adapters
        ]
