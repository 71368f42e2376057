"""What leaves a labeling project or a version: a project's agreed labels as a new version of its
dataset (``labeling_project_export``, an import job like any other), and a version's rows as CSV
or XLSX, for people who read them in a spreadsheet.

Spreadsheet programs take a cell that starts with ``=``, ``+``, ``-`` or ``@`` (or a tab or a
carriage return before one) as a formula: a row whose text is ``=HYPERLINK("http://…")`` or
``=cmd|' /C calc'!A0`` would run when an engineer opens the export (CSV injection, OWASP). So:

- CSV: such a cell is prefixed with a single quote, which spreadsheets show as text (OWASP's
  advice);
- XLSX: every cell is written as a typed string with Excel's quote prefix (the cell style
  ``quotePrefix``), which is never evaluated, even after the cell is edited; the text stays
  as it is, without a visible quote. Characters that XML 1.0 cannot hold (C0 controls other
  than tab, line feed and carriage return) become U+FFFD;
- the normalised JSONL download stays verbatim: it is data for programs, not for spreadsheets.

A cell holds a row's field as text: a list of labels joined with ``|`` (the separator an import
reads), entities and chat messages as JSON, so that an export imports again. A CSV cell that
got the quote keeps it on the way back (the quote is part of the cell's text); the XLSX and the
JSONL downloads import again unchanged.
"""

import csv
import dataclasses
import io
import json
import tempfile
from collections.abc import Iterator
from typing import IO

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.db import transaction
from django.http import FileResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils.http import content_disposition_header
from django.utils.translation import gettext as _

from labeling import consensus, pipeline, selectors, task_kinds
from labeling.imports import import_job_queue, import_options
from labeling.models import DatasetVersion, ImportJob, LabelingProject
from labeling.readers import XLSX_MAX_ROWS


@transaction.atomic
def labeling_project_export(
    *, actor: AbstractBaseUser, project: LabelingProject, rule: str, reviewer: str = ""
) -> ImportJob:
    """A new version of the source version's rows with the labels agreed in Label Studio
    (conflicts resolved by ``rule``), imported like any other: checked, split kept."""
    if rule not in consensus.RULES:
        raise ValidationError(_("Unknown conflict rule “%(rule)s”.") % {"rule": rule})
    if rule == "reviewer" and not reviewer:
        raise ValidationError(_("Name the reviewer whose choice wins."))
    version = project.source_version
    dataset = version.dataset
    options = {
        "mapping": {f: f for f in task_kinds.get(dataset.task_kind).field_names()},
        "drop_duplicates": False,
        "ratios": version.options.get("ratios") or list(pipeline.DEFAULT_RATIOS),
        "seed": version.options.get("seed", 42),
    }
    parsed = import_options(dataset, options)
    # The annotations were checked against the project's labels, which may differ from the
    # dataset's; the rows keep the splits they have.
    parsed = dataclasses.replace(parsed, keep_splits=True, labels=None)
    return import_job_queue(
        actor=actor,
        dataset=dataset,
        audit=("labeling_project.export", project, {"rule": rule, "reviewer": reviewer}),
        source=DatasetVersion.Source.LABELING,
        parents=[version.pk],
        format="jsonl",
        encoding="utf-8",
        options={
            **parsed.as_dict(),
            "export": {"project": project.pk, "rule": rule, "reviewer": reviewer},
        },
        bytes_total=default_storage.size(version.data_file),
    )


# -- Versions as spreadsheets -------------------------------------------------------------------

FORMATS = ("csv", "xlsx")
# What makes a spreadsheet read a cell as a formula (OWASP, CSV injection).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
CSV_BATCH_ROWS = 1000


def neutralise(value: str) -> str:
    """A CSV cell that no spreadsheet evaluates: a single quote before a formula's start."""
    return "'" + value if value.startswith(FORMULA_PREFIXES) else value


def columns(version: DatasetVersion) -> list[str]:
    return [*task_kinds.get(version.dataset.task_kind).row_fields(), "split"]


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "|".join(value)
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _rows(version: DatasetVersion, names: list[str]) -> Iterator[list[str]]:
    with default_storage.open(version.data_file, "rb") as f:
        for line in f:
            row = json.loads(line)
            yield [_cell(row.get(name)) for name in names]


def export_filename(version: DatasetVersion, fmt: str) -> str:
    return f"{version.dataset.name}-v{version.number}.{fmt}"


def csv_chunks(version: DatasetVersion) -> Iterator[bytes]:
    """The version as UTF-8 CSV with a BOM (so that Excel reads Chinese right), in chunks of
    rows, streamed: memory stays bounded whatever the version's size."""
    names = columns(version)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow([neutralise(n) for n in names])
    yield "\ufeff".encode() + buffer.getvalue().encode()
    batch = 0
    buffer.seek(0)
    buffer.truncate()
    for cells in _rows(version, names):
        writer.writerow([neutralise(c) for c in cells])
        batch += 1
        if batch == CSV_BATCH_ROWS:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
            batch = 0
    if batch:
        yield buffer.getvalue().encode()


def xlsx_file(version: DatasetVersion) -> IO[bytes]:
    """The version as an XLSX workbook in an anonymous temporary file (in the platform's
    staging directory), open at its start; it is gone once closed."""
    from openpyxl import Workbook
    from openpyxl.cell import WriteOnlyCell
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE

    if version.row_count + 1 > XLSX_MAX_ROWS:
        raise ValidationError(
            _(
                "The version has %(rows)d rows; an XLSX sheet holds at most %(max)d. "
                "Download it as CSV."
            )
            % {"rows": version.row_count, "max": XLSX_MAX_ROWS - 1}
        )
    names = columns(version)
    workbook = Workbook(write_only=True)
    sheet = workbook.create_sheet(f"v{version.number}")

    def text_cells(values: list[str]) -> list:
        cells = []
        for value in values:
            cell = WriteOnlyCell(sheet, value=ILLEGAL_CHARACTERS_RE.sub("\ufffd", value))
            # A string, whatever it starts with: openpyxl would write "=…" as a formula.
            cell.data_type = "s"
            cell.quotePrefix = True
            cells.append(cell)
        return cells

    sheet.append(text_cells(names))
    for values in _rows(version, names):
        sheet.append(text_cells(values))
    settings.UPLOAD_STAGING_DIR.mkdir(parents=True, exist_ok=True)
    out = tempfile.TemporaryFile(dir=settings.UPLOAD_STAGING_DIR)
    try:
        workbook.save(out)
    except BaseException:
        out.close()
        raise
    out.seek(0)
    return out


def download_response(version: DatasetVersion, kind: str) -> HttpResponseBase:
    """A version's file to download: ``original``, ``normalized`` (JSONL, verbatim) or
    ``report`` as stored, ``csv`` or ``xlsx`` made from its rows; 404 for anything else."""
    if kind == "csv":
        response = StreamingHttpResponse(csv_chunks(version), content_type="text/csv")
        response["Content-Disposition"] = content_disposition_header(
            True, export_filename(version, "csv")
        )
        return response
    if kind == "xlsx":
        return FileResponse(
            xlsx_file(version),
            as_attachment=True,
            filename=export_filename(version, "xlsx"),
            content_type="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        )
    name, filename = selectors.version_file(version, kind)
    return FileResponse(default_storage.open(name, "rb"), as_attachment=True, filename=filename)
