import re

from django import forms
from django.utils.translation import gettext_lazy as _

from labeling import pipeline, task_kinds
from labeling.readers import ENCODINGS, FORMATS
from labeling.task_kinds import KIND_CHOICES


def split_labels(text: str) -> list[str]:
    """Labels typed in one field: separated by commas (either width) or new lines."""
    return [x.strip() for x in re.split(r"[,，\n]", text) if x.strip()]


class DatasetForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    task_kind = forms.ChoiceField(label=_("Task kind"), choices=KIND_CHOICES)
    labels = forms.CharField(
        label=_("Labels"),
        required=False,
        help_text=_("Optional, separated by commas: rows with other labels are rejected."),
    )
    description = forms.CharField(
        label=_("Description"), required=False, widget=forms.Textarea(attrs={"rows": 2})
    )

    def clean_labels(self) -> list[str]:
        return split_labels(self.cleaned_data["labels"])


class ImportForm(forms.Form):
    """Format, encoding, the column of each field of the task kind, and the options."""

    format = forms.ChoiceField(label=_("Format"), choices=[(f, f.upper()) for f in FORMATS])
    encoding = forms.ChoiceField(
        label=_("Encoding"), required=False, choices=[(e, e.upper()) for e in ENCODINGS]
    )
    fullwidth_to_halfwidth = forms.BooleanField(
        label=_("Convert full-width letters and digits to half-width"), required=False
    )
    drop_duplicates = forms.BooleanField(
        label=_("Drop duplicate rows"), required=False, initial=True
    )
    strict = forms.BooleanField(
        label=_("Strict: fail the whole import if any row is rejected"), required=False
    )
    train = forms.FloatField(label=_("Train"), min_value=0, initial=pipeline.DEFAULT_RATIOS[0])
    dev = forms.FloatField(label=_("Dev"), min_value=0, initial=pipeline.DEFAULT_RATIOS[1])
    test = forms.FloatField(label=_("Test"), min_value=0, initial=pipeline.DEFAULT_RATIOS[2])
    seed = forms.IntegerField(label=_("Seed"), initial=42)

    def __init__(self, *args, kind: str, columns: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        choices = [("", _("— not in the file —")), *[(c, c) for c in columns]]
        self.mapping_fields = []
        for field in task_kinds.get(kind).fields:
            name = f"map_{field.name}"
            self.fields[name] = forms.ChoiceField(
                label=field.name, choices=choices, required=field.required
            )
            self.mapping_fields.append(self[name])

    def clean(self):
        data = super().clean()
        if (data.get("train") or 0) + (data.get("dev") or 0) + (data.get("test") or 0) <= 0:
            raise forms.ValidationError(_("The split ratios add up to nothing."))
        return data

    def import_options(self) -> dict:
        data = self.cleaned_data
        return {
            "mapping": {k[4:]: v for k, v in data.items() if k.startswith("map_") and v},
            "fullwidth_to_halfwidth": data["fullwidth_to_halfwidth"],
            "drop_duplicates": data["drop_duplicates"],
            "strict": data["strict"],
            "ratios": [data["train"], data["dev"], data["test"]],
            "seed": data["seed"],
        }


class LabelingProjectForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    labels = forms.CharField(
        label=_("Labels"),
        required=False,
        help_text=_("Separated by commas; empty takes the dataset's labels."),
    )
    instructions = forms.CharField(
        label=_("Instructions for annotators"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    overlap = forms.IntegerField(
        label=_("Annotators per task"), min_value=1, max_value=10, initial=1
    )
    selection = forms.ChoiceField(label=_("Rows"), choices=[])
    sample_size = forms.IntegerField(label=_("Sample size"), required=False, min_value=1)
    split = forms.ChoiceField(
        label=_("Split"),
        required=False,
        choices=[("", "—"), *pipeline.SPLIT_LABELS.items()],
    )

    def __init__(self, *args, **kwargs) -> None:
        from labeling.models import LabelingProject

        super().__init__(*args, **kwargs)
        self.fields["selection"].choices = LabelingProject.Selection.choices

    def clean_labels(self) -> list[str]:
        return split_labels(self.cleaned_data["labels"])


class ExportForm(forms.Form):
    rule = forms.ChoiceField(
        label=_("When annotators disagree"),
        choices=[
            ("majority", _("the majority decides")),
            ("reviewer", _("a reviewer's choice wins")),
            ("drop", _("drop the row")),
        ],
    )
    reviewer = forms.CharField(label=_("Reviewer (username)"), required=False)
