"""Evaluation sets, ``evaluation``: the questions a causal LM is scored on
(``runtime.llm_eval``), never trained on.

- A multiple-choice row, in the C-Eval and CMMLU shape: ``question``, the options ``A`` to
  ``D``, ``answer`` (the correct option's letter) and an optional ``subject``.
- An open question: ``question`` and its ``references`` (one answer or several: a JSON list,
  or one text; or the ``answer`` column) and an optional ``subject``.

A row is labeled once it has its answer or a reference. In Label Studio an annotator picks the
correct option of a multiple-choice question, or writes the reference answer of an open one.
"""

from django.utils.translation import gettext_lazy as _

from labeling.normalize import Normalizer
from labeling.task_kinds.base import Field, Kind, RowError, clean_text
from labeling.task_kinds.generative import _json_value, _optional_text
from runtime.kinds import TaskKind
from runtime.llm_eval import OPTIONS

MAX_REFERENCES = 16
# The ways a file writes an answer's letter: "a", "A.", "（A）", "Ａ" (NFKC'd already).
_LETTER_CHARS = " .、:：()（）[]【】"


def answer_letter(value: str) -> str | None:
    """The option letter an answer cell names, or None."""
    letter = value.strip(_LETTER_CHARS).upper()
    return letter if letter in OPTIONS else None


class Evaluation(Kind):
    kind = TaskKind.EVALUATION
    label = _("Evaluation set (评测集)")
    fields = (
        Field("question", True, ("问题", "题目", "prompt", "query", "instruction")),
        *(Field(o, False, (f"选项{o}", f"option_{o.lower()}")) for o in OPTIONS),
        Field("answer", False, ("答案", "正确答案", "label")),
        Field("references", False, ("参考答案", "reference", "参考")),
        Field("subject", False, ("学科", "科目", "category", "类别")),
    )
    label_field = "answer"
    text_fields = ("question",)
    takes_labels = False  # the options are A to D, an open question's answer is written

    def propose_mapping(self, columns: list[str]) -> dict[str, str]:
        # An option is a column of its own name only: "A" is in "category" and "answer".
        mapping = super().propose_mapping(columns)
        for f in self.fields:
            if f.name in OPTIONS and f.name in mapping:
                names = {f.name.lower(), *(a.lower() for a in f.aliases)}
                if mapping[f.name].strip().lower() not in names:
                    del mapping[f.name]
        return mapping

    def build_row(self, record: dict, norm: Normalizer, labels: frozenset[str] | None) -> dict:
        row: dict = {"question": clean_text(record, "question", norm)}
        subject = _optional_text(record, "subject", norm)
        if subject:
            row["subject"] = subject
        options = {o: _optional_text(record, o, norm) for o in OPTIONS}
        answer = _optional_text(record, "answer", norm)
        if any(options.values()):
            missing = [o for o in OPTIONS if not options[o]]
            if missing:
                raise RowError(
                    "missing_option",
                    missing[0],
                    _("Option %(o)s is empty: a multiple-choice question has four, A to D.")
                    % {"o": missing[0]},
                )
            if not answer:
                raise RowError(
                    "missing_answer",
                    "answer",
                    _("The answer is missing: give the letter of the correct option, A to D."),
                )
            letter = answer_letter(answer)
            if letter is None:
                raise RowError(
                    "unknown_answer",
                    "answer",
                    _("The answer “%(a)s” is not one of the options A to D.") % {"a": answer[:40]},
                )
            return {**row, **options, "answer": letter}
        references = self._references(record, norm) or ([answer] if answer else [])
        if not references:
            raise RowError(
                "missing_reference",
                "references",
                _("An open question needs a reference answer (references, or answer)."),
            )
        return {**row, "references": references}

    def _references(self, record: dict, norm: Normalizer) -> list[str]:
        raw = _json_value(record.get("references"), "references")
        if raw is None or raw == "":
            return []
        items = raw if isinstance(raw, list) else [raw]
        if len(items) > MAX_REFERENCES:
            raise RowError(
                "too_many_references",
                "references",
                _("At most %(n)d references a question.") % {"n": MAX_REFERENCES},
            )
        references = []
        for item in items:
            if not isinstance(item, str | int | float) or isinstance(item, bool):
                raise RowError(
                    "bad_references", "references", _("A reference is a text, or a list of texts.")
                )
            text = norm.text(str(item))
            if text:
                references.append(text)
        return references

    def is_choice(self, row: dict) -> bool:
        return all(row.get(o) for o in OPTIONS)

    def is_labeled(self, row: dict) -> bool:
        return bool(row.get("answer") or row.get("references"))

    def row_labels(self, row: dict) -> list[str]:
        return [row["answer"]] if row.get("answer") else []

    def dedup_key(self, row: dict) -> str:
        if self.is_choice(row):
            return "\x1f".join([row["question"], *(row[o] for o in OPTIONS)])
        return row["question"]

    def text_length(self, row: dict) -> int:
        return len(self.dedup_key(row))

    def label_config(self, labels: list[str]) -> str:
        # The correct option, where the question has options; else the reference answer.
        options = "".join(f'<Choice value="{o}"/>' for o in OPTIONS)
        return (
            '<View><Header value="请阅读题目：选择题选出正确选项，问答题写出参考答案"/>'
            '<Text name="question" value="$question"/>'
            '<Text name="options" value="$options"/>'
            f'<Choices name="answer" toName="question" choice="single" showInLine="true" '
            f'required="false">{options}</Choices>'
            '<TextArea name="reference" toName="question" editable="true" maxSubmissions="1" '
            'rows="4" placeholder="参考答案（问答题）"/></View>'
        )

    def ls_data(self, row: dict) -> dict:
        options = (
            "\n".join(f"{o}. {row[o]}" for o in OPTIONS) if self.is_choice(row) else "（问答题）"
        )
        return {"question": row["question"], "options": options}

    def ls_result(self, row: dict) -> list[dict]:
        if row.get("answer"):
            return [
                {
                    "from_name": "answer",
                    "to_name": "question",
                    "type": "choices",
                    "value": {"choices": [row["answer"]]},
                }
            ]
        if row.get("references"):
            return [
                {
                    "from_name": "reference",
                    "to_name": "question",
                    "type": "textarea",
                    "value": {"text": [row["references"][0]]},
                }
            ]
        return []

    def parse_ls_result(self, result: list[dict], row: dict, labels: list[str]) -> dict:
        if self.is_choice(row):
            chosen = [
                c
                for item in result
                if item.get("type") == "choices"
                for c in (item.get("value") or {}).get("choices", [])
            ]
            if len(chosen) != 1 or chosen[0] not in OPTIONS:
                raise RowError("bad_labels", "answer", _("Choose the one correct option."))
            return {"answer": chosen[0]}
        texts = [
            t
            for item in result
            if item.get("type") == "textarea"
            for t in (item.get("value") or {}).get("text", [])
        ]
        reference = Normalizer().text("\n".join(t for t in texts if isinstance(t, str)))
        if not reference:
            raise RowError("missing_reference", "references", _("The reference answer is empty."))
        return {"references": [reference]}
