"""The import pipeline: records of a file → normalised, validated, deduplicated rows with
seeded stratified splits, a row-level report, statistics and a content hash.

It knows nothing of the ORM or of storage: it reads a binary stream and writes local files, so
that it streams in bounded memory and can be measured alone. ``labeling/README.md`` explains
the two passes.
"""

import bisect
import hashlib
import json
import os
import random
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from labeling.normalize import Normalizer
from labeling.readers import open_records
from labeling.task_kinds.base import Kind, RowError
from runtime.kinds import TaskKind

SPLITS = ("train", "dev", "test")
# The splits as pages name them.
SPLIT_LABELS = {
    "train": gettext_lazy("training set"),
    "dev": gettext_lazy("dev set"),
    "test": gettext_lazy("test set"),
}
PAGE_INDEX_STEP = 1000
LENGTH_BINS = (0, 10, 20, 50, 100, 200, 500, 1000)
PROGRESS_EVERY = 20_000
MAX_RAW_IN_REPORT = 500
# The train, dev and test shares of an import's rows where it names none.
DEFAULT_RATIOS = (0.8, 0.1, 0.1)


class ImportFailed(Exception):
    """The import as a whole failed; the report (if any) says row by row why."""


@dataclass(frozen=True)
class ImportOptions:
    mapping: dict[str, str]
    fullwidth_to_halfwidth: bool = False
    strict: bool = False
    drop_duplicates: bool = True
    ratios: tuple[float, float, float] = DEFAULT_RATIOS
    seed: int = 42
    labels: frozenset[str] | None = None
    # Rows that come with a split (a labeling export, a merge) keep it; others get one.
    keep_splits: bool = False

    def as_dict(self) -> dict:
        return {
            "mapping": self.mapping,
            "fullwidth_to_halfwidth": self.fullwidth_to_halfwidth,
            "strict": self.strict,
            "drop_duplicates": self.drop_duplicates,
            "ratios": list(self.ratios),
            "seed": self.seed,
            "labels": sorted(self.labels) if self.labels is not None else None,
            "keep_splits": self.keep_splits,
        }


@dataclass
class ImportResult:
    data_path: Path
    report_path: Path
    content_hash: str
    rows: int
    rejected: int
    duplicates: int
    columns: list[str]
    stats: dict
    split_counts: dict[str, int]
    page_index: list[int]
    errors_by_reason: dict[str, int] = field(default_factory=dict)


def split_targets(n: int, ratios: tuple[float, ...]) -> list[int]:
    """Counts per split that sum to n, by largest remainder."""
    total = sum(ratios)
    exact = [n * r / total for r in ratios]
    counts = [int(x) for x in exact]
    order = sorted(range(len(ratios)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


NO_SPLIT = 255


def assign_splits(
    strata: array, n_strata: int, ratios, seed: int, preset: bytearray | None = None
) -> bytearray:
    """A split for each row: exact per-stratum counts, uniformly random given the seed.

    Selection sampling (Knuth's Algorithm S) in one pass: a row takes split k with probability
    (rows split k still needs in its stratum) / (rows of its stratum still to come). Rows with
    a ``preset`` split keep it and take no part.
    """
    remaining = [0] * n_strata
    for i, s in enumerate(strata):
        if preset is None or preset[i] == NO_SPLIT:
            remaining[s] += 1
    needed = [split_targets(n, ratios) for n in remaining]
    rng = random.Random(seed)  # noqa: S311 - reproducible splits, not secrets
    assigned = bytearray(len(strata)) if preset is None else bytearray(preset)
    for i, s in enumerate(strata):
        if preset is not None and preset[i] != NO_SPLIT:
            continue
        pick = rng.random() * remaining[s]
        need = needed[s]
        k = 0
        while k < len(need) - 1 and pick >= need[k]:
            pick -= need[k]
            k += 1
        need[k] -= 1
        remaining[s] -= 1
        assigned[i] = k
    return assigned


_encode_str = json.encoder.encode_basestring
_encode_any = json.JSONEncoder(ensure_ascii=False).encode


def _to_json(row: dict) -> str:
    """A row as one JSON line. Strings and nulls, most of every row, skip the general encoder,
    which costs several times more per call (keys are the schema's own ASCII names)."""
    return (
        "{"
        + ", ".join(
            [
                f'"{k}": '
                + (_encode_str(v) if type(v) is str else "null" if v is None else _encode_any(v))
                for k, v in row.items()
            ]
        )
        + "}"
    )


def _report_line(row: int, error: RowError, action: str, raw) -> str:
    if isinstance(raw, dict):
        raw = {k: (v[:MAX_RAW_IN_REPORT] if isinstance(v, str) else v) for k, v in raw.items()}
    entry = {
        "row": row,
        "column": error.column,
        "reason": error.reason,
        "message": str(error.message),
        "action": action,
        "raw": raw,
    }
    return json.dumps(entry, ensure_ascii=False, default=str) + "\n"


def run_import(
    stream: BinaryIO,
    *,
    fmt: str,
    encoding: str | None,
    schema: Kind,
    options: ImportOptions,
    workdir: Path,
    progress: Callable[[int], None] | None = None,
) -> ImportResult:
    columns, records = open_records(stream, fmt, encoding)
    mapping = options.mapping
    missing = [f.name for f in schema.fields if f.required and f.name not in mapping]
    if missing:
        raise ImportFailed(
            _("No column is mapped to the required field(s): %(fields)s.")
            % {"fields": ", ".join(missing)}
        )
    unknown = sorted(c for c in mapping.values() if c not in columns)
    if unknown and fmt != "jsonl":
        raise ImportFailed(
            _("The mapping names column(s) the file does not have: %(columns)s.")
            % {"columns": ", ".join(unknown)}
        )

    norm = Normalizer(options.fullwidth_to_halfwidth)
    workdir.mkdir(parents=True, exist_ok=True)
    rows_tmp = workdir / "rows.tmp.jsonl"
    data_path = workdir / "data.jsonl"
    report_path = workdir / "report.jsonl"
    digest = hashlib.sha256()
    seen: set[int] = set()
    strata_ids: dict[str, int] = {}
    strata = array("I")
    preset = bytearray()
    split_codes = {name: k for k, name in enumerate(SPLITS)}
    label_counts: dict[str, int] = {}
    length_hist = [0] * len(LENGTH_BINS)
    reasons: Counter = Counter()
    rejected = duplicates = kept = read = unlabeled = 0
    fields, columns_of = list(mapping), list(mapping.values())
    is_ner = schema.kind == TaskKind.NER
    # Hot loop: look the per-row callables up once.
    build_row, dedup_key, row_labels = schema.build_row, schema.dedup_key, schema.row_labels
    separators = len(schema.text_fields) - 1
    # Rows without the team's labels (generative, evaluation): whether a row has its answer,
    # and a note on those without.
    answered = not schema.takes_labels
    is_labeled, note, text_length = schema.is_labeled, schema.note, schema.text_length
    seen_add, strata_append, digest_update = seen.add, strata.append, digest.update
    bisect_right = bisect.bisect_right
    allowed = options.labels
    max_labels = schema.max_labels

    with (
        open(rows_tmp, "wb") as out,
        open(report_path, "w", encoding="utf-8") as report,
    ):
        write = out.write
        for row_number, record in records:
            read += 1
            if progress is not None and read % PROGRESS_EVERY == 0:
                progress(read)
            if isinstance(record, RowError):
                rejected += 1
                reasons[record.reason] += 1
                report.write(_report_line(row_number, record, "rejected", None))
                continue
            try:
                row = build_row(
                    dict(zip(fields, map(record.get, columns_of), strict=True)), norm, allowed
                )
            except RowError as error:
                rejected += 1
                reasons[error.reason] += 1
                report.write(_report_line(row_number, error, "rejected", record))
                continue
            labels = row_labels(row)
            if len(label_counts) + len(labels) > max_labels and (
                len(label_counts) + len({x for x in labels if x not in label_counts}) > max_labels
            ):
                # The labels are the rows' to choose: past the kind's limit, a row with one
                # more is refused and the rows with the labels already seen go on.
                rejected += 1
                reasons["too_many_labels"] += 1
                error = RowError(
                    "too_many_labels",
                    schema.label_field or schema.text_fields[0],
                    _(
                        "The label “%(label)s” would be label %(n)d: a dataset of this kind "
                        "holds at most %(max)d."
                    )
                    % {
                        "label": next(x for x in labels if x not in label_counts),
                        "n": len(label_counts) + 1,
                        "max": max_labels,
                    },
                )
                report.write(_report_line(row_number, error, "rejected", record))
                continue
            text_key = dedup_key(row)
            key = hash(text_key)
            if key in seen:
                duplicates += 1
                reasons["duplicate"] += 1
                dup = RowError(
                    "duplicate",
                    schema.text_fields[0],
                    _("Duplicate of an earlier row after normalisation."),
                )
                action = "dropped" if options.drop_duplicates else "kept"
                report.write(_report_line(row_number, dup, action, record))
                if options.drop_duplicates:
                    continue
            seen_add(key)
            line = (_to_json(row) + "\n").encode()
            write(line)
            digest_update(line)
            kept += 1
            for label in labels:
                label_counts[label] = label_counts.get(label, 0) + 1
            if answered:
                length = text_length(row)
                if not is_labeled(row):
                    unlabeled += 1
                    remark = note(row)
                    reasons[remark.reason] += 1
                    report.write(_report_line(row_number, remark, "kept", record))
            else:
                length = len(text_key) - separators
                if not labels:
                    unlabeled += 1
            length_hist[bisect_right(LENGTH_BINS, length) - 1] += 1
            if is_ner:
                stratum = ""
            elif len(labels) == 1:
                stratum = labels[0]
            else:
                stratum = "|".join(sorted(labels))
            stratum_id = strata_ids.get(stratum)
            if stratum_id is None:
                stratum_id = strata_ids[stratum] = len(strata_ids)
            strata_append(stratum_id)
            if options.keep_splits:
                preset.append(split_codes.get(record.get("split"), NO_SPLIT))
    del seen
    if progress is not None:
        progress(read)

    if kept == 0:
        raise ImportFailed(
            _("No valid row remains of %(read)d read: see the report for each row.")
            % {"read": read}
        )
    if options.strict and rejected:
        raise ImportFailed(
            _("Strict mode: %(n)d row(s) were rejected, so nothing was imported.") % {"n": rejected}
        )

    splits = assign_splits(
        strata,
        len(strata_ids),
        options.ratios,
        options.seed,
        preset if options.keep_splits else None,
    )
    del strata
    page_index = []
    # Bytes in, bytes out: the split is appended to each line without decoding it again.
    suffixes = [f', "split": "{name}"}}\n'.encode() for name in SPLITS]
    with open(rows_tmp, "rb") as src, open(data_path, "wb") as out:
        offset = 0
        for i, line in enumerate(src):
            if i % PAGE_INDEX_STEP == 0:
                page_index.append(offset)
            final = line[:-2] + suffixes[splits[i]]
            out.write(final)
            offset += len(final)
    split_counts = {name: splits.count(k) for k, name in enumerate(SPLITS)}
    os.unlink(rows_tmp)

    stats = {
        "labels": dict(sorted(label_counts.items(), key=lambda kv: -kv[1])),
        "unlabeled": unlabeled,
        "length_bins": list(LENGTH_BINS),
        "length_hist": length_hist,
        # For NER the labels are the entities' labels, counted once per entity.
        "entities": dict(sorted(label_counts.items(), key=lambda kv: -kv[1])) if is_ner else {},
    }
    return ImportResult(
        data_path=data_path,
        report_path=report_path,
        content_hash=digest.hexdigest(),
        rows=kept,
        rejected=rejected,
        duplicates=duplicates,
        columns=columns,
        stats=stats,
        split_counts=split_counts,
        page_index=page_index,
        errors_by_reason=dict(reasons),
    )
