"""Text matching, ``text_pair``: a row is ``text_a``, ``text_b`` and ``label`` (their relation,
one label chosen in Label Studio, as a classification of the pair)."""

from django.utils.translation import gettext_lazy as _

from labeling.normalize import Normalizer
from labeling.task_kinds.base import Field, choices_config, clean_label, clean_text
from labeling.task_kinds.classification import TextClassification
from runtime.kinds import TaskKind


class TextPair(TextClassification):
    kind = TaskKind.TEXT_PAIR
    label = _("Text matching (文本匹配)")
    fields = (
        Field("text_a", True, ("sentence1", "query", "句子1", "文本1", "question1")),
        Field("text_b", True, ("sentence2", "title", "句子2", "文本2", "question2")),
        Field("label", False, ("标签", "是否相似", "similar", "category")),
    )
    label_field = "label"
    text_fields = ("text_a", "text_b")

    def build_row(self, record: dict, norm: Normalizer, labels: frozenset[str] | None) -> dict:
        return {
            "text_a": clean_text(record, "text_a", norm),
            "text_b": clean_text(record, "text_b", norm),
            "label": clean_label(record.get("label"), "label", norm, labels),
        }

    def label_config(self, labels: list[str]) -> str:
        return (
            '<View><Header value="请判断两段文本的关系"/><Text name="text_a" value="$text_a"/>'
            '<Text name="text_b" value="$text_b"/>'
            + choices_config(labels, "label", "text_a", "single")
            + "</View>"
        )
