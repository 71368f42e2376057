"""Streaming readers of uploaded files: format and encoding detection, and records one by one.

A reader yields ``(row_number, record)`` where record is a dict of column → value, or
``(row_number, RowError)`` for a row that cannot be read (bad JSON, undecodable bytes). Row
numbers are what a user sees in the file: the header is row 1 of a CSV; JSONL lines count from 1.
Memory stays bounded: nothing reads the whole file.
"""

import codecs
import csv
import io
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import charset_normalizer
from django.utils.translation import gettext as _

from labeling.task_kinds.base import RowError, parse_json

FORMATS = ("csv", "tsv", "jsonl", "xlsx")
ENCODINGS = ("utf-8", "utf-8-sig", "gbk", "gb18030")
SAMPLE_BYTES = 256 * 1024
# Python's codec for each encoding we offer: GB18030 is a superset of GBK, so GBK files decode
# as GB18030, which also reads the few characters GBK exporters emit beyond GBK.
_CODECS = {"utf-8": "utf-8", "utf-8-sig": "utf-8-sig", "gbk": "gb18030", "gb18030": "gb18030"}
_UNDECODABLE = "\ufffd"

# The longest line (and so the longest CSV value) read, in characters: a longer line is refused
# (CSV) or reported as its row (JSONL) without being held in memory. Far beyond any text a model
# reads; a file with such a line is not a dataset of texts.
MAX_LINE_CHARS = 16 * 1024 * 1024
csv.field_size_limit(MAX_LINE_CHARS)
# What an XLSX sheet can hold (Excel's limits): a sheet with more rows or columns is refused.
XLSX_MAX_ROWS = 1_048_576
XLSX_MAX_COLUMNS = 16_384
# A workbook member smaller than this may expand by any ratio (tiny XML parts compress well).
XLSX_RATIO_GRACE_BYTES = 100 * 1024


class FileError(ValueError):
    """The file as a whole cannot be read (wrong format, no header, unknown encoding)."""


@dataclass
class Detected:
    format: str
    encoding: str | None  # None for XLSX
    confident: bool


def detect_format(filename: str, head: bytes) -> str:
    name = filename.lower()
    for ext, fmt in (
        (".tsv", "tsv"),
        (".jsonl", "jsonl"),
        (".json", "jsonl"),
        (".xlsx", "xlsx"),
        (".csv", "csv"),
        (".txt", "tsv"),
    ):
        if name.endswith(ext):
            return fmt
    if head.startswith(b"PK\x03\x04"):
        return "xlsx"
    if head.lstrip()[:1] in (b"{", b"["):
        return "jsonl"
    return "tsv" if head.count(b"\t") > head.count(b",") else "csv"


def detect_encoding(sample: bytes) -> tuple[str, bool]:
    """The encoding of a sample, among those offered, and whether the detection is sure.

    Strict decoding decides among the offered encodings (valid UTF-8 is almost never GBK by
    chance); charset-normalizer confirms, and guesses for a sample that none decodes (a file
    with a few corrupt bytes), in which case the user is told it is a guess.
    """
    if sample.startswith(codecs.BOM_UTF8):
        return "utf-8-sig", True
    # Whole lines only: a sample cut inside a character would look undecodable.
    cut = sample[: sample.rfind(b"\n") + 1] or sample
    best = charset_normalizer.from_bytes(
        cut, cp_isolation=["utf_8", "gb18030", "gbk"], preemptive_behaviour=False
    ).best()
    guess = (
        {"utf_8": "utf-8", "gb18030": "gb18030", "gbk": "gbk"}.get(best.encoding) if best else None
    )
    for name in ("utf-8", "gbk", "gb18030"):
        try:
            cut.decode(name)
        except UnicodeDecodeError:
            continue
        # GB18030 names a file that needs more than GBK; plain GBK text is named GBK.
        sure = guess == name or (guess in ("gbk", "gb18030") and name != "utf-8")
        return name, sure or name == "utf-8"
    return guess or "utf-8", False


def detect(filename: str, stream: BinaryIO) -> Detected:
    head = stream.read(SAMPLE_BYTES)
    stream.seek(0)
    fmt = detect_format(filename, head)
    if fmt == "xlsx":
        return Detected("xlsx", None, True)
    encoding, confident = detect_encoding(head)
    return Detected(fmt, encoding, confident)


def _text_stream(stream: BinaryIO, encoding: str) -> io.TextIOWrapper:
    # Undecodable bytes become U+FFFD; the row that holds them is reported, not the whole file.
    return io.TextIOWrapper(stream, encoding=_CODECS[encoding], errors="replace", newline="")


def _bounded_lines(text: io.TextIOBase) -> Iterator[str | None]:
    """The lines of ``text``; None stands for a line longer than MAX_LINE_CHARS, whose rest is
    read in blocks and dropped, so memory stays bounded whatever the file holds."""
    limit = MAX_LINE_CHARS
    readline = text.readline
    while True:
        line = readline(limit + 1)
        if not line:
            return
        if len(line) > limit and line[-1] not in "\r\n":
            while True:
                rest = readline(1024 * 1024)
                if not rest or rest[-1] in "\r\n":
                    break
            yield None
            continue
        yield line


def _too_long_message() -> str:
    return _("The line is longer than %(n)d characters.") % {"n": MAX_LINE_CHARS}


def _undecodable(values: list[str]) -> bool:
    return _UNDECODABLE in "".join(values)


def _bad_bytes_error(encoding: str) -> RowError:
    return RowError(
        "undecodable",
        "",
        _("Bytes that are not valid %(encoding)s: choose another encoding, or fix this row.")
        % {"encoding": encoding.upper()},
    )


def read_delimited(
    stream: BinaryIO, encoding: str, delimiter: str
) -> tuple[list[str], Iterator[tuple[int, dict | RowError]]]:
    text = _text_stream(stream, encoding)
    lines = _bounded_lines(text)

    def physical_lines() -> Iterator[str]:
        for number, line in enumerate(lines, start=1):
            if line is None:
                # Within a quoted value the csv module cannot resume after the cut: the file
                # as a whole is refused, naming the line.
                raise FileError(
                    _("Line %(line)d: %(error)s") % {"line": number, "error": _too_long_message()}
                )
            yield line

    reader = csv.reader(physical_lines(), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        raise FileError(_("The file is empty.")) from None
    except csv.Error as exc:
        raise FileError(_("Row 1 (the header): %(error)s") % {"error": _csv_error(exc)}) from exc
    header = [h.strip() for h in header]
    if not any(header):
        raise FileError(_("The first row holds no column names."))
    if _undecodable(header):
        raise FileError(
            _("The header is not valid %(encoding)s: choose another encoding.")
            % {"encoding": encoding.upper()}
        )
    width = len(header)

    def rows() -> Iterator[tuple[int, dict | RowError]]:
        end_of_last = reader.line_num
        while True:
            try:
                values = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                # A value over the size limit: inside a quoted value the csv module cannot
                # find where the next row starts, so the file as a whole is refused.
                raise FileError(
                    _("Row %(row)d: %(error)s") % {"row": end_of_last + 1, "error": _csv_error(exc)}
                ) from exc
            # A quoted field may span lines: a row is numbered by the line it starts on.
            row_number, end_of_last = end_of_last + 1, reader.line_num
            if not values or (len(values) == 1 and not values[0].strip()):
                continue
            if _undecodable(values):
                yield row_number, _bad_bytes_error(encoding)
                continue
            if len(values) > width:
                yield (
                    row_number,
                    RowError(
                        "bad_columns",
                        "",
                        _("%(n)d values in a row under a header of %(w)d columns.")
                        % {"n": len(values), "w": width},
                    ),
                )
                continue
            yield row_number, dict(zip(header, values, strict=False))
        text.detach()  # the caller's stream stays open

    return header, rows()


def _csv_error(exc: csv.Error) -> str:
    if "field limit" in str(exc):
        return _("A value is longer than %(n)d characters.") % {"n": MAX_LINE_CHARS}
    return _("Not readable as CSV: %(error)s") % {"error": exc}


def read_jsonl(
    stream: BinaryIO, encoding: str
) -> tuple[list[str], Iterator[tuple[int, dict | RowError]]]:
    text = _text_stream(stream, encoding)
    peeked: list[tuple[int, dict | RowError]] = []
    columns: list[str] = []

    def parse() -> Iterator[tuple[int, dict | RowError]]:
        for number, line in enumerate(_bounded_lines(text), start=1):
            if line is None:
                yield number, RowError("too_long", "", _too_long_message())
                continue
            if not line.strip():
                continue
            if _UNDECODABLE in line:
                yield number, _bad_bytes_error(encoding)
                continue
            try:
                record = parse_json(line)
            except ValueError as exc:
                yield (
                    number,
                    RowError("bad_json", "", _("Not valid JSON: %(error)s") % {"error": exc}),
                )
                continue
            if not isinstance(record, dict):
                yield number, RowError("bad_json", "", _("A line must hold a JSON object."))
                continue
            yield number, record

    records = parse()
    # The columns are the keys of the first records, for the mapping.
    for item in records:
        peeked.append(item)
        if isinstance(item[1], dict):
            columns.extend(k for k in item[1] if k not in columns)
        if len(peeked) >= 20:
            break

    def rows() -> Iterator[tuple[int, dict | RowError]]:
        yield from peeked
        yield from records
        text.detach()  # the caller's stream stays open

    return columns, rows()


def _check_workbook_archive(stream: BinaryIO) -> None:
    """Refuse a zip bomb before openpyxl expands anything: a member that expands more than
    XLSX_MAX_COMPRESSION_RATIO times, or members that expand to more than
    XLSX_MAX_UNCOMPRESSED_BYTES together (both in settings). Python's zipfile never expands a
    member past the size its directory declares, so the declared sizes bound the work."""
    from django.conf import settings

    try:
        with zipfile.ZipFile(stream) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        raise FileError(_("Not a readable XLSX workbook: %(error)s") % {"error": exc}) from exc
    finally:
        stream.seek(0)
    ratio, limit = settings.XLSX_MAX_COMPRESSION_RATIO, settings.XLSX_MAX_UNCOMPRESSED_BYTES
    total = 0
    for member in members:
        total += member.file_size
        if (
            member.file_size > XLSX_RATIO_GRACE_BYTES
            and member.file_size > max(member.compress_size, 1) * ratio
        ):
            raise FileError(
                _(
                    "“%(member)s” in the workbook expands from %(packed)d to %(size)d bytes, "
                    "more than %(ratio)d times: refused as a possible zip bomb."
                )
                % {
                    "member": member.filename,
                    "packed": member.compress_size,
                    "size": member.file_size,
                    "ratio": ratio,
                }
            )
        if total > limit:
            raise FileError(
                _(
                    "The workbook expands to more than %(limit)d MB, the limit of this platform "
                    "(PLATFORM_XLSX_MAX_UNCOMPRESSED_MB): save its sheet as CSV instead."
                )
                % {"limit": limit // 2**20}
            )


def read_xlsx(stream: BinaryIO) -> tuple[list[str], Iterator[tuple[int, dict | RowError]]]:
    import openpyxl

    _check_workbook_archive(stream)
    try:
        workbook = openpyxl.load_workbook(stream, read_only=True, data_only=True)
        sheet = workbook.worksheets[0]
    except Exception as exc:
        raise FileError(_("Not a readable XLSX workbook: %(error)s") % {"error": exc}) from exc
    # The size a sheet declares (its <dimension>) is not trusted: openpyxl would pad every row
    # to the declared width and add rows up to the declared height, so a sheet of three cells
    # that declares A1:XFD1048576 would take hours. Rows are read as they are.
    sheet.reset_dimensions()
    cells = sheet.iter_rows(values_only=True)

    def next_row(number: int) -> tuple | None:
        if number > XLSX_MAX_ROWS:
            raise FileError(
                _("Row %(row)d: an XLSX sheet holds at most %(max)d rows.")
                % {"row": number, "max": XLSX_MAX_ROWS}
            )
        try:
            values = next(cells, None)
        except Exception as exc:
            # A broken sheet (bad XML, a cell reference out of range…) as openpyxl finds it;
            # openpyxl numbers missing rows only once it has read the next one.
            raise FileError(
                _("After row %(row)d, the sheet cannot be read: %(error)s")
                % {"row": number - 1, "error": exc}
                if number > 1
                else _("The sheet cannot be read: %(error)s") % {"error": exc}
            ) from exc
        if values is not None and len(values) > XLSX_MAX_COLUMNS:
            raise FileError(
                _("Row %(row)d: an XLSX sheet holds at most %(max)d columns.")
                % {"row": number, "max": XLSX_MAX_COLUMNS}
            )
        return values

    first = next_row(1)
    if first is None:
        raise FileError(_("The first sheet is empty."))
    header = ["" if v is None else str(v).strip() for v in first]
    if not any(header):
        raise FileError(_("The first row holds no column names."))

    def rows() -> Iterator[tuple[int, dict | RowError]]:
        number = 1
        while (values := next_row(number + 1)) is not None:
            number += 1
            if all(v is None or (isinstance(v, str) and not v.strip()) for v in values):
                continue
            yield (
                number,
                {
                    h: ("" if v is None else v if isinstance(v, str) else _cell_text(v))
                    for h, v in zip(header, values, strict=False)
                    if h
                },
            )
        workbook.close()

    return header, rows()


def _cell_text(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def open_records(
    stream: BinaryIO, fmt: str, encoding: str | None
) -> tuple[list[str], Iterator[tuple[int, dict | RowError]]]:
    """The columns of a file and an iterator over its records."""
    if fmt not in FORMATS:
        raise FileError(_("Unknown format “%(format)s”.") % {"format": fmt})
    if fmt == "xlsx":
        return read_xlsx(stream)
    if encoding not in ENCODINGS:
        raise FileError(_("Unsupported encoding “%(encoding)s”.") % {"encoding": encoding})
    if fmt == "jsonl":
        return read_jsonl(stream, encoding)
    return read_delimited(stream, encoding, "\t" if fmt == "tsv" else ",")
