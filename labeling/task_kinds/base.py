"""What every task kind shares: the base class ``Kind`` (a kind as datasets and Label Studio see
it), the error a row that cannot be imported raises, strict JSON parsing, the checks of a text
and a label, and the pieces of Label Studio configs.

A row is a dict with the kind's fields (each kind's module says which). Labels may be missing:
unlabeled rows go to labeling next.
"""

import json
import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from xml.sax.saxutils import escape as _xml_escape

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from labeling.normalize import Normalizer
from runtime.kinds import GENERATIVE_KINDS, TaskKind


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


# The most characters a label may have: a label is a name in a labeling config, a model's
# head and every report, not a text.
MAX_LABEL_CHARS = 200


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


@dataclass(frozen=True)
class Field:
    name: str
    required: bool
    aliases: tuple[str, ...] = ()


class Kind(ABC):
    """A task kind as datasets see it: its fields, the header names that map to them, how a
    mapped record becomes a valid row or an error; and as Label Studio sees it: its labeling
    config in Chinese, a row as a task and as a prediction, an annotation back as the row's
    fields. One subclass per kind, registered in ``labeling.task_kinds.KINDS``."""

    kind: TaskKind
    # The kind's name in the console (the model fields' choices).
    label: Promise
    fields: tuple[Field, ...]
    # The field that carries the annotation, if any: stratification and statistics use it.
    label_field: str | None
    text_fields: tuple[str, ...] = ("text",)
    # Whether its rows carry labels the team defines (its label config lists them); a kind
    # without (the generative kinds, evaluation sets) is labeled once a row has its answer.
    takes_labels: bool = True
    # The most distinct labels a dataset version of the kind may hold: a model's head, its
    # report's confusion and the labeling config grow with them (a tagger's transitions with
    # their square), and the rows, which an uploader writes, choose how many.
    max_labels: int = 2000

    @property
    def generative(self) -> bool:
        return self.kind in GENERATIVE_KINDS

    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def row_fields(self) -> list[str]:
        """The fields of a stored row."""
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

    @abstractmethod
    def build_row(self, record: dict, norm: Normalizer, labels: frozenset[str] | None) -> dict:
        """A normalised, valid row from a mapped record ({field: raw value}), or RowError."""

    @abstractmethod
    def label_config(self, labels: list[str]) -> str:
        """The Label Studio labeling config of this kind, in Chinese, for ``labels``."""

    def ls_data(self, row: dict) -> dict:
        """A row's fields as a Label Studio task's data."""
        return {f: row[f] for f in self.text_fields}

    def is_labeled(self, row: dict) -> bool:
        """Whether a row has its annotation (a label, or a generative kind's answer)."""
        return bool(self.row_labels(row))

    @abstractmethod
    def ls_result(self, row: dict) -> list[dict]:
        """A row's existing labels as a Label Studio result (for predictions); [] if none."""

    @abstractmethod
    def parse_ls_result(self, result: list[dict], row: dict, labels: list[str]) -> dict:
        """A Label Studio annotation's result, checked against the project's labels and the
        row's text, in the dataset's terms; RowError says what is wrong. Label Studio itself
        does not check results against the labeling config."""

    @abstractmethod
    def row_labels(self, row: dict) -> list[str]:
        """The labels a row carries, for statistics and stratification."""

    def strata_key(self, row: dict) -> str:
        """What splits are stratified by: the label, the label set (or nothing)."""
        return "|".join(sorted(self.row_labels(row)))

    def dedup_key(self, row: dict) -> str:
        """The row's text, which duplicates share; search looks in it too."""
        if len(self.text_fields) == 1:
            return row[self.text_fields[0]]
        return "\x1f".join([row[f] for f in self.text_fields])

    def text_length(self, row: dict) -> int:
        return sum(len(row[f]) for f in self.text_fields)

    def note(self, row: dict) -> RowError | None:
        """What the import report says of a row it keeps, if anything."""
        return None


def clean_text(record: dict, name: str, norm: Normalizer) -> str:
    value = record.get(name)
    if type(value) is not str:
        value = "" if value is None else str(value)
    text = norm.text(value)
    if not text:
        raise RowError("empty_text", name, _("The text is empty."))
    return text


def clean_label(value, name: str, norm: Normalizer, labels: frozenset[str] | None) -> str | None:
    if value is None or value == "":
        return None
    label = norm.label(value if type(value) is str else str(value))
    if not label:
        return None
    if labels is not None and label not in labels:
        raise RowError("unknown_label", name, _("Unknown label “%(label)s”.") % {"label": label})
    if len(label) > MAX_LABEL_CHARS:
        raise RowError(
            "bad_labels",
            name,
            _("The label is %(n)d characters long (at most %(max)d).")
            % {"n": len(label), "max": MAX_LABEL_CHARS},
        )
    control = _CONTROL.search(label)
    if control:
        raise RowError(
            "bad_labels",
            name,
            _("The label holds the control character U+%(code)04X.") % {"code": ord(control[0])},
        )
    return label


# -- Label Studio configs -------------------------------------------------------------------


def escape(value: str) -> str:
    return _xml_escape(value, {'"': "&quot;"})


HOTKEYS = "1234567890qwertyuiopasdfghjklzxcvbnm"
COLOURS = ("#1456f0", "#d83931", "#2ea121", "#de7802", "#7f3bf5", "#0fa3a3", "#c2185b", "#5d4037")


def label_tags(tag: str, labels: list[str], *, coloured: bool = False) -> str:
    """One ``<tag value="label"/>`` a label, in order, the first ones with a hotkey (and, for
    spans, a colour each)."""
    return "".join(
        f'<{tag} value="{escape(label)}"'
        + (f' background="{COLOURS[i % len(COLOURS)]}"' if coloured else "")
        + (f' hotkey="{HOTKEYS[i]}"' if i < len(HOTKEYS) else "")
        + "/>"
        for i, label in enumerate(labels)
    )


def choices_config(labels: list[str], name: str, to: str, choice: str) -> str:
    options = label_tags("Choice", labels)
    return (
        f'<Choices name="{name}" toName="{to}" choice="{choice}" showInLine="true" '
        f'required="false">{options}</Choices>'
    )
