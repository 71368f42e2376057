"""The task kinds of the platform, as datasets see them: one definition per kind of its fields,
the header names that map to them, and how a mapped record becomes a valid row or an error.

A row is a dict with the kind's fields: ``text`` and ``label`` (text_classification), ``text``
and ``labels`` (multi_label), ``text`` and ``entities`` (ner, character offsets, end exclusive),
``text_a``, ``text_b`` and ``label`` (text_pair). Labels may be missing: unlabeled rows go to
labeling next.
"""

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from xml.sax.saxutils import escape as _xml_escape

from django.db import models
from django.utils.translation import gettext_lazy as _

from labeling.normalize import Normalizer


class TaskKind(models.TextChoices):
    TEXT_CLASSIFICATION = "text_classification", _("Text classification (单标签分类)")
    MULTI_LABEL = "multi_label", _("Multi-label classification (多标签分类)")
    NER = "ner", _("Named entity recognition (命名实体识别)")
    TEXT_PAIR = "text_pair", _("Text matching (文本匹配)")


class RowError(ValueError):
    """A row that cannot be imported: ``column`` names the field, ``reason`` is a short code."""

    def __init__(self, reason: str, column: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.column = column
        self.message = message


# Separators between the labels of a multi_label cell: "财经|科技", "财经、科技"…
LABEL_SEPARATORS = "|,;，；、"


@dataclass(frozen=True)
class Field:
    name: str
    required: bool
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Schema:
    kind: TaskKind
    fields: tuple[Field, ...]
    # The field that carries the annotation, if any: stratification and statistics use it.
    label_field: str | None
    text_fields: tuple[str, ...] = ("text",)
    _build: Callable = field(default=None, repr=False, compare=False)

    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def propose_mapping(self, columns: list[str]) -> dict[str, str]:
        """Field → column, from the header's names: an exact name or alias first (any case),
        then a column whose name contains one ("评论内容" holds "评论")."""
        mapping: dict[str, str] = {}
        taken: set[str] = set()
        for exact in (True, False):
            for f in self.fields:
                if f.name in mapping:
                    continue
                for candidate in (f.name, *f.aliases):
                    c = candidate.lower()
                    found = next(
                        (
                            col
                            for col in columns
                            if col not in taken
                            and (col.strip().lower() == c if exact else c in col.lower())
                        ),
                        None,
                    )
                    if found is not None:
                        mapping[f.name] = found
                        taken.add(found)
                        break
        return mapping

    def build_row(self, record: dict, norm: Normalizer, labels: frozenset[str] | None) -> dict:
        """A normalised, valid row from a mapped record ({field: raw value}), or RowError."""
        return self._build(record, norm, labels)

    def label_config(self, labels: list[str]) -> str:
        """The Label Studio labeling config of this kind, in Chinese, for ``labels``."""
        return _LABEL_CONFIGS[self.kind](labels)

    def ls_data(self, row: dict) -> dict:
        """A row's fields as a Label Studio task's data."""
        return {f: row[f] for f in self.text_fields}

    def ls_result(self, row: dict) -> list[dict]:
        """A row's existing labels as a Label Studio result (for predictions); [] if none."""
        if self.kind == TaskKind.NER:
            return [
                {
                    "from_name": "entities",
                    "to_name": "text",
                    "type": "labels",
                    "value": {
                        "start": e["start"],
                        "end": e["end"],
                        "text": row["text"][e["start"] : e["end"]],
                        "labels": [e["label"]],
                    },
                }
                for e in row.get("entities") or []
            ]
        labels = self.row_labels(row)
        if not labels:
            return []
        from_name = "labels" if self.kind == TaskKind.MULTI_LABEL else "label"
        return [
            {
                "from_name": from_name,
                "to_name": self.text_fields[0],
                "type": "choices",
                "value": {"choices": labels},
            }
        ]

    def parse_ls_result(self, result: list[dict], row: dict, labels: list[str]) -> dict:
        """A Label Studio annotation's result, checked against the project's labels and the
        row's text, in the dataset's terms; RowError says what is wrong. Label Studio itself
        does not check results against the labeling config."""
        allowed = set(labels)
        if self.kind == TaskKind.NER:
            entities = []
            for item in result:
                if item.get("type") != "labels":
                    continue
                value = item.get("value") or {}
                start, end = value.get("start"), value.get("end")
                found = value.get("labels") or []
                if not isinstance(start, int) or not isinstance(end, int) or len(found) != 1:
                    raise RowError(
                        "bad_entities", "entities", _("A span without offsets or label.")
                    )
                entities.append({"start": start, "end": end, "label": found[0]})
            # The same checks as an import: bounds, overlaps, known labels.
            return {
                "entities": _build_ner(
                    {"text": row["text"], "entities": entities}, Normalizer(), frozenset(allowed)
                )["entities"]
            }
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
        if self.kind == TaskKind.MULTI_LABEL:
            return {"labels": sorted(set(choices))}
        if len(choices) != 1:
            raise RowError(
                "bad_labels",
                "label",
                _("Exactly one label is expected, not %(n)d.") % {"n": len(choices)},
            )
        return {"label": choices[0]}

    def row_labels(self, row: dict) -> list[str]:
        """The labels a row carries, for statistics and stratification."""
        if self.label_field == "label":
            value = row.get("label")
            return [value] if value else []
        if self.kind == TaskKind.MULTI_LABEL:
            return row.get("labels") or []
        return [e["label"] for e in row.get("entities") or []]

    def strata_key(self, row: dict) -> str:
        """What splits are stratified by: the label, the label set, or nothing for NER."""
        if self.kind == TaskKind.NER:
            return ""
        return "|".join(sorted(self.row_labels(row)))

    def dedup_key(self, row: dict) -> str:
        if len(self.text_fields) == 1:
            return row[self.text_fields[0]]
        return "\x1f".join([row[f] for f in self.text_fields])

    def text_length(self, row: dict) -> int:
        return sum(len(row[f]) for f in self.text_fields)


def _text(record: dict, name: str, norm: Normalizer) -> str:
    value = record.get(name)
    if type(value) is not str:
        value = "" if value is None else str(value)
    text = norm.text(value)
    if not text:
        raise RowError("empty_text", name, _("The text is empty."))
    return text


def _label(value, name: str, norm: Normalizer, labels: frozenset[str] | None) -> str | None:
    if value is None or value == "":
        return None
    label = norm.label(value if type(value) is str else str(value))
    if not label:
        return None
    if labels is not None and label not in labels:
        raise RowError("unknown_label", name, _("Unknown label “%(label)s”.") % {"label": label})
    return label


def _build_classification(record, norm, labels):
    # The most common kind: the checks of _text and _label inlined on the usual path.
    text, label = record.get("text"), record.get("label")
    text = norm.text(text) if type(text) is str else _text(record, "text", norm)
    if not text:
        raise RowError("empty_text", "text", _("The text is empty."))
    if label is not None and label != "":
        label = _label(label, "label", norm, labels)
    return {"text": text, "label": label or None}


def _build_multi_label(record, norm, labels):
    value = record.get("labels")
    if isinstance(value, str):
        for sep in LABEL_SEPARATORS[1:]:
            value = value.replace(sep, LABEL_SEPARATORS[0])
        value = value.split(LABEL_SEPARATORS[0])
    elif value is None:
        value = []
    elif not isinstance(value, list):
        raise RowError("bad_labels", "labels", _("Labels must be a list or a separated string."))
    found = []
    for item in value:
        label = _label(item, "labels", norm, labels)
        if label and label not in found:
            found.append(label)
    return {"text": _text(record, "text", norm), "labels": found}


def _build_pair(record, norm, labels):
    return {
        "text_a": _text(record, "text_a", norm),
        "text_b": _text(record, "text_b", norm),
        "label": _label(record.get("label"), "label", norm, labels),
    }


def _build_ner(record, norm, labels):
    raw = record.get("text")
    raw = raw if isinstance(raw, str) else "" if raw is None else str(raw)
    entities = record.get("entities")
    if isinstance(entities, str):
        try:
            entities = json.loads(entities) if entities.strip() else []
        except json.JSONDecodeError as exc:
            raise RowError(
                "bad_json", "entities", _("The entities are not valid JSON: %(e)s") % {"e": exc}
            ) from exc
    if entities is None:
        entities = []
    if not isinstance(entities, list):
        raise RowError("bad_entities", "entities", _("The entities must be a list."))
    spans = []
    for i, entity in enumerate(entities):
        if not isinstance(entity, dict) or not {"start", "end", "label"} <= entity.keys():
            raise RowError(
                "bad_entities",
                "entities",
                _("Entity %(n)d needs start, end and label.") % {"n": i + 1},
            )
        start, end = entity["start"], entity["end"]
        if not isinstance(start, int) or not isinstance(end, int) or not 0 <= start < end:
            raise RowError(
                "span_outside_text",
                "entities",
                _("Entity %(n)d has an empty or negative span [%(s)s, %(e)s).")
                % {"n": i + 1, "s": start, "e": end},
            )
        if end > len(raw):
            raise RowError(
                "span_outside_text",
                "entities",
                _("Entity %(n)d [%(s)d, %(e)d) lies outside the text of %(len)d characters.")
                % {"n": i + 1, "s": start, "e": end, "len": len(raw)},
            )
        label = _label(entity["label"], "entities", norm, labels)
        if label is None:
            raise RowError(
                "bad_entities", "entities", _("Entity %(n)d has no label.") % {"n": i + 1}
            )
        spans.append((start, end, label))
    spans.sort()
    for (s1, e1, l1), (s2, e2, l2) in itertools.pairwise(spans):
        if s2 < e1:
            raise RowError(
                "overlapping_spans",
                "entities",
                _("Entities [%(s1)d, %(e1)d) %(l1)s and [%(s2)d, %(e2)d) %(l2)s overlap.")
                % {"s1": s1, "e1": e1, "l1": l1, "s2": s2, "e2": e2, "l2": l2},
            )
    text, remap = norm.text_with_offsets(raw)
    if not text:
        raise RowError("empty_text", "text", _("The text is empty."))
    moved = []
    for start, end, label in spans:
        new_start, new_end = remap(start), remap(end)
        if new_end <= new_start:
            raise RowError(
                "span_outside_text",
                "entities",
                _("Entity [%(s)d, %(e)d) %(l)s covers only whitespace.")
                % {"s": start, "e": end, "l": label},
            )
        moved.append({"start": new_start, "end": new_end, "label": label})
    return {"text": text, "entities": moved}


# -- Label Studio configs -------------------------------------------------------------------


def escape(value: str) -> str:
    return _xml_escape(value, {'"': "&quot;"})


HOTKEYS = "1234567890qwertyuiopasdfghjklzxcvbnm"
COLOURS = ("#1456f0", "#d83931", "#2ea121", "#de7802", "#7f3bf5", "#0fa3a3", "#c2185b", "#5d4037")


def _choices(labels: list[str], name: str, to: str, choice: str) -> str:
    options = "".join(
        f'<Choice value="{escape(label)}"'
        + (f' hotkey="{HOTKEYS[i]}"' if i < len(HOTKEYS) else "")
        + "/>"
        for i, label in enumerate(labels)
    )
    return (
        f'<Choices name="{name}" toName="{to}" choice="{choice}" showInLine="true" '
        f'required="false">{options}</Choices>'
    )


def _config_classification(labels: list[str]) -> str:
    return (
        '<View><Header value="请阅读文本并选择一个类别"/><Text name="text" value="$text"/>'
        + _choices(labels, "label", "text", "single")
        + "</View>"
    )


def _config_multi_label(labels: list[str]) -> str:
    return (
        '<View><Header value="请阅读文本并选择所有适用的类别"/><Text name="text" value="$text"/>'
        + _choices(labels, "labels", "text", "multiple")
        + "</View>"
    )


def _config_pair(labels: list[str]) -> str:
    return (
        '<View><Header value="请判断两段文本的关系"/><Text name="text_a" value="$text_a"/>'
        '<Text name="text_b" value="$text_b"/>'
        + _choices(labels, "label", "text_a", "single")
        + "</View>"
    )


def _config_ner(labels: list[str]) -> str:
    spans = "".join(
        f'<Label value="{escape(label)}" background="{COLOURS[i % len(COLOURS)]}"'
        + (f' hotkey="{HOTKEYS[i]}"' if i < len(HOTKEYS) else "")
        + "/>"
        for i, label in enumerate(labels)
    )
    # Character granularity: Chinese has no spaces for word boundaries.
    return (
        '<View><Header value="请选中文本中的实体并标注类型"/>'
        f'<Labels name="entities" toName="text">{spans}</Labels>'
        '<Text name="text" value="$text" granularity="symbol"/></View>'
    )


_LABEL_CONFIGS = {
    TaskKind.TEXT_CLASSIFICATION: _config_classification,
    TaskKind.MULTI_LABEL: _config_multi_label,
    TaskKind.NER: _config_ner,
    TaskKind.TEXT_PAIR: _config_pair,
}

SCHEMAS: dict[str, Schema] = {
    TaskKind.TEXT_CLASSIFICATION: Schema(
        TaskKind.TEXT_CLASSIFICATION,
        (
            Field("text", True, ("文本", "内容", "content", "sentence", "review", "评论", "句子")),
            Field(
                "label",
                False,
                (
                    "标签",
                    "类别",
                    "分类",
                    "情感",
                    "极性",
                    "category",
                    "class",
                    "sentiment",
                    "labels",
                ),
            ),
        ),
        label_field="label",
        _build=_build_classification,
    ),
    TaskKind.MULTI_LABEL: Schema(
        TaskKind.MULTI_LABEL,
        (
            Field("text", True, ("文本", "内容", "content", "sentence", "评论", "句子")),
            Field("labels", False, ("label", "标签", "类别", "categories", "tags")),
        ),
        label_field="labels",
        _build=_build_multi_label,
    ),
    TaskKind.NER: Schema(
        TaskKind.NER,
        (
            Field("text", True, ("文本", "内容", "content", "sentence", "句子")),
            Field("entities", False, ("实体", "spans", "label", "labels")),
        ),
        label_field="entities",
        _build=_build_ner,
    ),
    TaskKind.TEXT_PAIR: Schema(
        TaskKind.TEXT_PAIR,
        (
            Field("text_a", True, ("sentence1", "query", "句子1", "文本1", "question1")),
            Field("text_b", True, ("sentence2", "title", "句子2", "文本2", "question2")),
            Field("label", False, ("标签", "是否相似", "similar", "category")),
        ),
        label_field="label",
        text_fields=("text_a", "text_b"),
        _build=_build_pair,
    ),
}


def schema_for(kind: str) -> Schema:
    return SCHEMAS[kind]
