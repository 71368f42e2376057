"""Named entity recognition, ``ner``: a row is ``text`` and ``entities``
(``[{"start", "end", "label"}]``, character offsets, end exclusive), spans marked in Label
Studio character by character (Chinese has no spaces between words)."""

import itertools

from django.utils.translation import gettext_lazy as _

from labeling.normalize import Normalizer
from labeling.task_kinds.base import (
    Field,
    Kind,
    RowError,
    clean_label,
    label_tags,
    parse_json,
)
from runtime.kinds import TaskKind


class Ner(Kind):
    kind = TaskKind.NER
    label = _("Named entity recognition (命名实体识别)")
    # Each type is two tags (B-, I-) and the CRF's transitions are tags × tags.
    max_labels = 100
    fields = (
        Field("text", True, ("文本", "内容", "content", "sentence", "句子")),
        Field("entities", False, ("实体", "spans", "label", "labels")),
    )
    label_field = "entities"

    def build_row(self, record: dict, norm: Normalizer, labels: frozenset[str] | None) -> dict:
        raw = record.get("text")
        raw = raw if isinstance(raw, str) else "" if raw is None else str(raw)
        entities = record.get("entities")
        if isinstance(entities, str):
            try:
                entities = parse_json(entities) if entities.strip() else []
            except ValueError as exc:
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
            label = clean_label(entity["label"], "entities", norm, labels)
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

    def label_config(self, labels: list[str]) -> str:
        spans = label_tags("Label", labels, coloured=True)
        # Character granularity: Chinese has no spaces for word boundaries.
        return (
            '<View><Header value="请选中文本中的实体并标注类型"/>'
            f'<Labels name="entities" toName="text">{spans}</Labels>'
            '<Text name="text" value="$text" granularity="symbol"/></View>'
        )

    def row_labels(self, row: dict) -> list[str]:
        return [e["label"] for e in row.get("entities") or []]

    def strata_key(self, row: dict) -> str:
        return ""  # splits of NER rows are not stratified

    def ls_result(self, row: dict) -> list[dict]:
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

    def parse_ls_result(self, result: list[dict], row: dict, labels: list[str]) -> dict:
        entities = []
        for item in result:
            if item.get("type") != "labels":
                continue
            value = item.get("value") or {}
            start, end = value.get("start"), value.get("end")
            found = value.get("labels") or []
            if not isinstance(start, int) or not isinstance(end, int) or len(found) != 1:
                raise RowError("bad_entities", "entities", _("A span without offsets or label."))
            entities.append({"start": start, "end": end, "label": found[0]})
        # The same checks as an import: bounds, overlaps, known labels.
        return {
            "entities": self.build_row(
                {"text": row["text"], "entities": entities}, Normalizer(), frozenset(labels)
            )["entities"]
        }
