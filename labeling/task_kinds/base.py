"""The task kinds of the platform, as datasets see them: one definition per kind of its fields,
the header names that map to them, and how a mapped record becomes a valid row or an error.

A row is a dict with the kind's fields: ``text`` and ``label`` (text_classification), ``text``
and ``labels`` (multi_label), ``text`` and ``entities`` (ner, character offsets, end exclusive),
``text_a``, ``text_b`` and ``label`` (text_pair). Labels may be missing: unlabeled rows go to
labeling next.

The generative kinds have no labels but answers: ``messages`` (instruction: the chat normal form,
``[{"role": "system"|"user"|"assistant", "content"}]``, which Alpaca and ShareGPT records are
converted to; a conversation that ends on the user's turn awaits its response) and ``prompt``,
``chosen``, ``rejected`` (preference, for DPO; a pair not yet judged has ``response_a`` and
``response_b`` instead).
"""

import itertools
import json
import math
import re
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
    INSTRUCTION = "instruction", _("Instruction tuning (指令微调)")
    PREFERENCE = "preference", _("Preference pairs (偏好数据)")


# Kinds whose model generates text (a causal LM) rather than classifying.
GENERATIVE = frozenset({TaskKind.INSTRUCTION, TaskKind.PREFERENCE})


class RowError(ValueError):
    """A row that cannot be imported: ``column`` names the field, ``reason`` is a short code."""

    def __init__(self, reason: str, column: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.column = column
        self.message = message


# A \uD800–\uDFFF escape: JSON may name half of a surrogate pair, which is no character.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
# C0 and C1 control characters: no label holds one (and PostgreSQL's JSON refuses U+0000).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


# JSON nested deeper than this is refused: no dataset needs it, and whatever handles the value
# later (the preview's serialisation, Label Studio) recurses once per level.
MAX_JSON_DEPTH = 64


def _nested_deeper_than(value, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _no_constant(name: str):
    raise ValueError(_("%(name)s is not a JSON value") % {"name": name})


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e400: JSON holds no infinity
        raise ValueError(_("the number %(n)s is out of range") % {"n": text[:40]})
    return number


def parse_json(value: str):
    """``json.loads`` whose every failure is a ValueError that says what is wrong, for the
    user: invalid JSON, nesting too deep for the parser, an integer too long to convert, NaN
    and Infinity (Python's extensions, which no JSON reader after us accepts), a lone
    surrogate escape (which no UTF-8 file can hold)."""
    try:
        parsed = json.loads(value, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ValueError(
            _("%(error)s (character %(pos)d)") % {"error": exc.msg, "pos": exc.pos + 1}
        ) from exc
    except RecursionError as exc:
        raise ValueError(
            _("nested too deeply (more than %(n)d levels)") % {"n": MAX_JSON_DEPTH}
        ) from exc
    except ValueError as exc:  # int() of thousands of digits, NaN, Infinity, 1e400
        raise ValueError(str(exc)) from exc
    # Counting brackets (strings' included) is cheap; only a line with many is walked.
    if value.count("[") + value.count("{") > MAX_JSON_DEPTH and _nested_deeper_than(
        parsed, MAX_JSON_DEPTH
    ):
        raise ValueError(_("nested too deeply (more than %(n)d levels)") % {"n": MAX_JSON_DEPTH})
    if _SURROGATE_ESCAPE.search(value):
        try:
            json.dumps(parsed, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                _("a \\u escape names half of a surrogate pair, which is no character")
            ) from exc
    return parsed


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
    # Generative kinds: the row's whole text (dedup, search), and whether it has its answer.
    _text_of: Callable | None = field(default=None, repr=False, compare=False)
    _answered: Callable | None = field(default=None, repr=False, compare=False)

    @property
    def generative(self) -> bool:
        return self.kind in GENERATIVE

    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def row_fields(self) -> list[str]:
        """The fields of a stored row (an instruction row keeps only its messages)."""
        if self.kind == TaskKind.INSTRUCTION:
            return ["messages", "rating"]
        return self.field_names()

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
        if self.kind == TaskKind.INSTRUCTION:
            return {"dialogue": prompt_turns(row["messages"])}
        if self.kind == TaskKind.PREFERENCE:
            a, b = preference_pair(row)
            return {"prompt": row["prompt"], "response_a": a, "response_b": b}
        return {f: row[f] for f in self.text_fields}

    def is_labeled(self, row: dict) -> bool:
        """Whether a row has its annotation (a label, or a generative kind's answer)."""
        if self._answered is not None:
            return self._answered(row)
        return bool(self.row_labels(row))

    def ls_result(self, row: dict) -> list[dict]:
        """A row's existing labels as a Label Studio result (for predictions); [] if none."""
        if self.kind == TaskKind.INSTRUCTION:
            if not self.is_labeled(row):
                return []
            return [
                {
                    "from_name": "response",
                    "to_name": "dialogue",
                    "type": "textarea",
                    "value": {"text": [row["messages"][-1]["content"]]},
                }
            ]
        if self.kind == TaskKind.PREFERENCE:
            if not self.is_labeled(row):
                return []
            # Label Studio shows chosen on the left (preference_pair).
            return [
                {
                    "from_name": "preference",
                    "to_name": "response_a",
                    "type": "pairwise",
                    "value": {"selected": "left"},
                }
            ]
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
        if self.kind == TaskKind.INSTRUCTION:
            return _parse_response(result, row)
        if self.kind == TaskKind.PREFERENCE:
            return _parse_preference(result, row)
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
        """The row's text, which duplicates share; search looks in it too."""
        if self._text_of is not None:
            return self._text_of(row)
        if len(self.text_fields) == 1:
            return row[self.text_fields[0]]
        return "\x1f".join([row[f] for f in self.text_fields])

    def text_length(self, row: dict) -> int:
        if self._text_of is not None:
            return len(self._text_of(row))
        return sum(len(row[f]) for f in self.text_fields)

    def note(self, row: dict) -> RowError | None:
        """What the import report says of a row it keeps: a conversation awaiting its
        response goes to labeling."""
        if self.kind == TaskKind.INSTRUCTION and not self.is_labeled(row):
            return RowError(
                "no_assistant_turn",
                "messages",
                _("No assistant turn: kept without a response, for labeling."),
            )
        if self.kind == TaskKind.PREFERENCE and not self.is_labeled(row):
            return RowError(
                "not_judged",
                "chosen",
                _("No chosen and rejected response: kept as a pair to compare, for labeling."),
            )
        return None


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
    control = _CONTROL.search(label)
    if control:
        raise RowError(
            "bad_labels",
            name,
            _("The label holds the control character U+%(code)04X.") % {"code": ord(control[0])},
        )
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


# -- Generative kinds -------------------------------------------------------------------------

ROLES = ("system", "user", "assistant")
# ShareGPT's and other corpora's names of the roles.
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}


def _json_value(value, column: str):
    """A list or object that a CSV or XLSX cell carries as JSON text."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return parse_json(value)
        except ValueError as exc:
            raise RowError("bad_json", column, _("Not valid JSON: %(e)s") % {"e": exc}) from exc
    return value


def _optional_text(record: dict, name: str, norm: Normalizer) -> str:
    value = record.get(name)
    if value is None:
        return ""
    return norm.text(value if isinstance(value, str) else str(value))


def _messages_from_alpaca(record: dict, norm: Normalizer) -> list[dict]:
    instruction = _optional_text(record, "instruction", norm)
    if not instruction:
        raise RowError(
            "empty_turn", "instruction", _("The instruction is empty, so there is no user turn.")
        )
    extra = _optional_text(record, "input", norm)
    messages = []
    system = _optional_text(record, "system", norm)
    if system:
        messages.append({"role": "system", "content": system})
    messages.append(
        {"role": "user", "content": f"{instruction}\n{extra}" if extra else instruction}
    )
    output = _optional_text(record, "output", norm)
    if output:
        messages.append({"role": "assistant", "content": output})
    return messages


def _build_instruction(record, norm, labels):
    row = {"messages": _instruction_messages(record, norm)}
    rating = record.get("rating")
    if rating not in (None, ""):
        try:
            rating = int(rating)
        except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's Infinity
            rating = None
        if rating is None or not 1 <= rating <= 5:
            raise RowError("bad_rating", "rating", _("A rating is a whole number from 1 to 5."))
        row["rating"] = rating
    return row


def _instruction_messages(record, norm) -> list[dict]:
    raw = _json_value(record.get("messages"), "messages")
    if raw is None or raw == "" or raw == []:
        return _messages_from_alpaca(record, norm)
    if not isinstance(raw, list):
        raise RowError("bad_messages", "messages", _("The messages must be a list of turns."))
    messages = []
    for i, turn in enumerate(raw, start=1):
        if not isinstance(turn, dict):
            raise RowError("bad_messages", "messages", _("Turn %(n)d is not an object.") % {"n": i})
        role = turn.get("role", turn.get("from"))
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        if role not in ROLES:
            raise RowError(
                "unknown_role",
                "messages",
                _("Turn %(n)d has the role “%(role)s”; it must be system, user or assistant.")
                % {"n": i, "role": role},
            )
        content = turn.get("content", turn.get("value"))
        content = norm.text(content) if isinstance(content, str) else ""
        if not content:
            raise RowError("empty_turn", "messages", _("Turn %(n)d is empty.") % {"n": i})
        messages.append({"role": role, "content": content})
    _check_order(messages)
    return messages


def _check_order(messages: list[dict]) -> None:
    """An optional system turn, then user and assistant turns alternating from the user's."""
    expected = "user"
    for i, turn in enumerate(messages, start=1):
        if turn["role"] == "system" and i == 1:
            continue
        if turn["role"] != expected:
            raise RowError(
                "roles_out_of_order",
                "messages",
                _("Turn %(n)d is from the %(role)s where the %(expected)s speaks.")
                % {"n": i, "role": turn["role"], "expected": expected},
            )
        expected = "assistant" if expected == "user" else "user"
    if not any(t["role"] == "user" for t in messages):
        raise RowError("empty_turn", "messages", _("The conversation has no user turn."))


def prompt_turns(messages: list[dict]) -> list[dict]:
    """The turns before the final response (all of them when it is still to be written)."""
    return messages[:-1] if messages and messages[-1]["role"] == "assistant" else messages


def _instruction_text(row: dict) -> str:
    return "\x1f".join(f"{t['role']}:{t['content']}" for t in row["messages"])


def _build_preference(record, norm, labels):
    prompt = _json_value(record.get("prompt"), "prompt")
    if isinstance(prompt, list):  # a conversation: its last user turn is the prompt
        users = [
            t.get("content") for t in prompt if isinstance(t, dict) and t.get("role") == "user"
        ]
        prompt = users[-1] if users else ""
    row = {"prompt": _text({"prompt": prompt}, "prompt", norm)}
    chosen = _optional_text(record, "chosen", norm)
    rejected = _optional_text(record, "rejected", norm)
    if chosen or rejected:
        if not (chosen and rejected):
            column = "rejected" if chosen else "chosen"
            raise RowError(
                "empty_turn", column, _("A preference pair needs both chosen and rejected.")
            )
        if chosen == rejected:
            raise RowError("same_responses", "rejected", _("Chosen and rejected are the same."))
        return {**row, "chosen": chosen, "rejected": rejected}
    a = _optional_text(record, "response_a", norm)
    b = _optional_text(record, "response_b", norm)
    if not (a and b):
        raise RowError(
            "empty_turn",
            "chosen",
            _("Give chosen and rejected, or two responses to compare (response_a, response_b)."),
        )
    if a == b:
        raise RowError("same_responses", "response_b", _("The two responses are the same."))
    return {**row, "response_a": a, "response_b": b}


def preference_pair(row: dict) -> tuple[str, str]:
    """The two responses as Label Studio shows them: chosen first when judged."""
    if row.get("chosen"):
        return row["chosen"], row["rejected"]
    return row["response_a"], row["response_b"]


def _preference_text(row: dict) -> str:
    a, b = sorted(preference_pair(row))
    return "\x1f".join((row["prompt"], a, b))


def _parse_response(result: list[dict], row: dict) -> dict:
    texts = [
        t
        for item in result
        if item.get("type") == "textarea"
        for t in (item.get("value") or {}).get("text", [])
    ]
    response = Normalizer().text("\n".join(t for t in texts if isinstance(t, str)))
    if not response:
        raise RowError("empty_turn", "messages", _("The response is empty."))
    value = {
        "messages": [*prompt_turns(row["messages"]), {"role": "assistant", "content": response}]
    }
    ratings = [
        (item.get("value") or {}).get("rating") for item in result if item.get("type") == "rating"
    ]
    if ratings and isinstance(ratings[-1], int):
        value["rating"] = ratings[-1]
    return value


def _parse_preference(result: list[dict], row: dict) -> dict:
    selected = [
        (item.get("value") or {}).get("selected")
        for item in result
        if item.get("type") == "pairwise"
    ]
    if len(selected) != 1 or selected[0] not in ("left", "right"):
        raise RowError("bad_labels", "chosen", _("Choose the better of the two responses."))
    a, b = preference_pair(row)
    chosen, rejected = (a, b) if selected[0] == "left" else (b, a)
    return {"chosen": chosen, "rejected": rejected}


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


def _config_instruction(labels: list[str]) -> str:
    # The conversation so far, the response to write or correct, and a rating of it.
    return (
        '<View><Header value="请阅读对话，撰写或修改助手的回答，并为回答打分"/>'
        '<Paragraphs name="dialogue" value="$dialogue" layout="dialogue" nameKey="role" '
        'textKey="content"/>'
        '<TextArea name="response" toName="dialogue" editable="true" maxSubmissions="1" '
        'rows="6" required="true" placeholder="助手的回答"/>'
        '<Rating name="rating" toName="dialogue" maxRating="5"/></View>'
    )


def _config_preference(labels: list[str]) -> str:
    return (
        '<View><Header value="请阅读问题，选择更好的回答"/><Text name="prompt" value="$prompt"/>'
        '<Pairwise name="preference" toName="response_a,response_b"/>'
        '<View style="display: flex; gap: 1em;">'
        '<View style="flex: 1;"><Header value="回答 A" size="6"/>'
        '<Text name="response_a" value="$response_a"/></View>'
        '<View style="flex: 1;"><Header value="回答 B" size="6"/>'
        '<Text name="response_b" value="$response_b"/></View></View></View>'
    )


_LABEL_CONFIGS = {
    TaskKind.TEXT_CLASSIFICATION: _config_classification,
    TaskKind.MULTI_LABEL: _config_multi_label,
    TaskKind.NER: _config_ner,
    TaskKind.TEXT_PAIR: _config_pair,
    TaskKind.INSTRUCTION: _config_instruction,
    TaskKind.PREFERENCE: _config_preference,
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
    TaskKind.INSTRUCTION: Schema(
        TaskKind.INSTRUCTION,
        (
            Field("messages", False, ("conversations", "对话", "dialogue", "chat")),
            # The Alpaca format: instruction, optional input, output.
            Field("instruction", False, ("指令", "prompt", "question", "问题", "query")),
            Field("input", False, ("输入", "context", "上下文")),
            Field("output", False, ("输出", "response", "answer", "回答", "答案")),
            Field("system", False, ("系统", "system_prompt")),
            # An annotator's 1–5 rating of the response (Label Studio's Rating).
            Field("rating", False, ("评分",)),
        ),
        label_field=None,
        text_fields=("messages",),
        _build=_build_instruction,
        _text_of=_instruction_text,
        _answered=lambda row: row["messages"][-1]["role"] == "assistant",
    ),
    TaskKind.PREFERENCE: Schema(
        TaskKind.PREFERENCE,
        (
            Field("prompt", True, ("instruction", "question", "问题", "指令", "query")),
            Field("chosen", False, ("优选", "better", "good", "好的回答")),
            Field("rejected", False, ("劣选", "worse", "bad", "差的回答")),
            Field("response_a", False, ("回答A", "answer_a", "output_a")),
            Field("response_b", False, ("回答B", "answer_b", "output_b")),
        ),
        label_field=None,
        text_fields=("prompt",),
        _build=_build_preference,
        _text_of=_preference_text,
        _answered=lambda row: bool(row.get("chosen")),
    ),
}


def schema_for(kind: str) -> Schema:
    return SCHEMAS[kind]
