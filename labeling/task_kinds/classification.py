"""Classification: ``text_classification`` (a row is ``text`` and ``label``, one label chosen in
Label Studio) and ``multi_label`` (``text`` and ``labels``, any number chosen)."""

from django.utils.translation import gettext_lazy as _

from labeling.normalize import Normalizer
from labeling.task_kinds.base import Field, Kind, RowError, choices_config, clean_label, clean_text
from runtime.kinds import TaskKind

# Separators between the labels of a multi_label cell: "财经|科技", "财经、科技"…
LABEL_SEPARATORS = "|,;，；、"


class TextClassification(Kind):
    kind = TaskKind.TEXT_CLASSIFICATION
    label = _("Text classification (单标签分类)")
    fields = (
        Field("text", True, ("文本", "内容", "content", "sentence", "review", "评论", "句子")),
        Field(
            "label",
            False,
            ("标签", "类别", "分类", "情感", "极性", "category", "class", "sentiment", "labels"),
        ),
    )
    label_field = "label"
    # The name of the label config's Choices tag.
    choices_name = "label"

    def build_row(self, record: dict, norm: Normalizer, labels: frozenset[str] | None) -> dict:
        # The most common kind: the checks of clean_text and clean_label inlined on the usual
        # path.
        text, label = record.get("text"), record.get("label")
        text = norm.text(text) if type(text) is str else clean_text(record, "text", norm)
        if not text:
            raise RowError("empty_text", "text", _("The text is empty."))
        if label is not None and label != "":
            label = clean_label(label, "label", norm, labels)
        return {"text": text, "label": label or None}

    def label_config(self, labels: list[str]) -> str:
        return (
            '<View><Header value="请阅读文本并选择一个类别"/><Text name="text" value="$text"/>'
            + choices_config(labels, "label", "text", "single")
            + "</View>"
        )

    def row_labels(self, row: dict) -> list[str]:
        value = row.get("label")
        return [value] if value else []

    def ls_result(self, row: dict) -> list[dict]:
        labels = self.row_labels(row)
        if not labels:
            return []
        return [
            {
                "from_name": self.choices_name,
                "to_name": self.text_fields[0],
                "type": "choices",
                "value": {"choices": labels},
            }
        ]

    def parse_ls_result(self, result: list[dict], row: dict, labels: list[str]) -> dict:
        allowed = set(labels)
        choices = [
            c
            for item in result
            if item.get("type") == "choices"
            for c in (item.get("value") or {}).get("choices", [])
        ]
        unknown = [c for c in choices if c not in allowed]
        if unknown:
            raise RowError(
                "unknown_label",
                self.label_field,
                _("Unknown label “%(label)s”.") % {"label": unknown[0]},
            )
        return self._answer(choices)

    def _answer(self, choices: list[str]) -> dict:
        """The row's fields from the labels chosen (all known)."""
        if len(choices) != 1:
            raise RowError(
                "bad_labels",
                "label",
                _("Exactly one label is expected, not %(n)d.") % {"n": len(choices)},
            )
        return {"label": choices[0]}


class MultiLabel(TextClassification):
    kind = TaskKind.MULTI_LABEL
    label = _("Multi-label classification (多标签分类)")
    fields = (
        Field("text", True, ("文本", "内容", "content", "sentence", "评论", "句子")),
        Field("labels", False, ("label", "标签", "类别", "categories", "tags")),
    )
    label_field = "labels"
    choices_name = "labels"

    def build_row(self, record: dict, norm: Normalizer, labels: frozenset[str] | None) -> dict:
        value = record.get("labels")
        if isinstance(value, str):
            for sep in LABEL_SEPARATORS[1:]:
                value = value.replace(sep, LABEL_SEPARATORS[0])
            value = value.split(LABEL_SEPARATORS[0])
        elif value is None:
            value = []
        elif not isinstance(value, list):
            raise RowError(
                "bad_labels", "labels", _("Labels must be a list or a separated string.")
            )
        found = []
        for item in value:
            label = clean_label(item, "labels", norm, labels)
            if label and label not in found:
                found.append(label)
        return {"text": clean_text(record, "text", norm), "labels": found}

    def label_config(self, labels: list[str]) -> str:
        return (
            '<View><Header value="请阅读文本并选择所有适用的类别"/>'
            '<Text name="text" value="$text"/>'
            + choices_config(labels, "labels", "text", "multiple")
            + "</View>"
        )

    def row_labels(self, row: dict) -> list[str]:
        return row.get("labels") or []

    def _answer(self, choices: list[str]) -> dict:
        return {"labels": sorted(set(choices))}
