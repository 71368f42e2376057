"""The import pipeline on real bytes: formats, encodings, validation, dedup, splits, hashing."""

import io
import json
from collections import Counter

import openpyxl
import pytest

from labeling import task_kinds
from labeling.pipeline import ImportFailed, ImportOptions, assign_splits, run_import, split_targets
from labeling.readers import detect

REVIEWS = [
    ["评论", "标签"],
    ["房间干净，服务周到。", "正面"],
    ["早餐太差了，不会再来。", "负面"],
    ["位置方便，价格合理。", "正面"],
]


def run(data: bytes, kind: str, tmp_path, fmt="csv", encoding="utf-8", **options):
    schema = task_kinds.get(kind)
    mapping = options.pop("mapping", None)
    if mapping is None:
        header = data.decode(encoding if encoding else "utf-8", errors="ignore").splitlines()[0]
        mapping = schema.propose_mapping(header.split("\t" if fmt == "tsv" else ","))
    return run_import(
        io.BytesIO(data),
        fmt=fmt,
        encoding=encoding,
        schema=schema,
        options=ImportOptions(mapping=mapping, **options),
        workdir=tmp_path,
    )


def rows_of(result) -> list[dict]:
    return [json.loads(line) for line in result.data_path.read_text("utf-8").splitlines()]


def report_of(result) -> list[dict]:
    return [json.loads(line) for line in result.report_path.read_text("utf-8").splitlines()]


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "gbk", "gb18030"])
def test_each_encoding_is_detected_and_read(csv_bytes, tmp_path, encoding):
    data = csv_bytes(REVIEWS, encoding)
    detected = detect("reviews.csv", io.BytesIO(data))
    # GB18030 text of GBK characters only is byte for byte GBK: both read the same.
    expected = "gbk" if encoding == "gb18030" else encoding
    assert (detected.format, detected.encoding) == ("csv", expected)
    result = run(data, "text_classification", tmp_path, encoding=encoding)
    assert [r["text"] for r in rows_of(result)] == [r[0] for r in REVIEWS[1:]]
    assert result.stats["labels"] == {"正面": 2, "负面": 1}


def test_gb18030_only_characters_are_named_gb18030(tmp_path):
    data = "文本,标签\n𠀀字与€符号,正面\n".encode("gb18030")
    assert detect("x.csv", io.BytesIO(data)).encoding == "gb18030"


def test_tsv_jsonl_and_xlsx(csv_bytes, tmp_path):
    tsv = csv_bytes(REVIEWS, delimiter="\t")
    assert run(tsv, "text_classification", tmp_path / "t", fmt="tsv").rows == 3
    jsonl = "".join(
        json.dumps({"text": t, "label": lab}, ensure_ascii=False) + "\n" for t, lab in REVIEWS[1:]
    ).encode()
    result = run(
        jsonl,
        "text_classification",
        tmp_path / "j",
        fmt="jsonl",
        mapping={"text": "text", "label": "label"},
    )
    assert result.rows == 3
    book = openpyxl.Workbook()
    for row in REVIEWS:
        book.active.append(row)
    buf = io.BytesIO()
    book.save(buf)
    assert detect("r.xlsx", io.BytesIO(buf.getvalue())).format == "xlsx"
    result = run(
        buf.getvalue(),
        "text_classification",
        tmp_path / "x",
        fmt="xlsx",
        encoding=None,
        mapping={"text": "评论", "label": "标签"},
    )
    assert [r["label"] for r in rows_of(result)] == ["正面", "负面", "正面"]


def test_validation_errors_name_row_column_and_reason(csv_bytes, tmp_path):
    data = csv_bytes(
        [["text", "label"], ["好", "正面"], ["  ", "正面"], ["差", "中性"], ["行", "负面"]]
    )
    data += "坏".encode() + b"\xff," + "负面\n".encode()
    result = run(data, "text_classification", tmp_path, labels=frozenset({"正面", "负面"}))
    assert result.rows == 2
    report = {(e["row"], e["column"], e["reason"]) for e in report_of(result)}
    assert report == {
        (3, "text", "empty_text"),
        (4, "label", "unknown_label"),
        (6, "", "undecodable"),
    }
    unknown = next(e for e in report_of(result) if e["reason"] == "unknown_label")
    assert "中性" in unknown["message"] and unknown["raw"] == {"text": "差", "label": "中性"}


def test_unlabeled_rows_are_kept(csv_bytes, tmp_path):
    result = run(
        csv_bytes([["text", "label"], ["有标签", "a"], ["无标签", ""]]),
        "text_classification",
        tmp_path,
    )
    assert [r["label"] for r in rows_of(result)] == ["a", None]
    assert result.stats["unlabeled"] == 1


def test_ner_spans_are_checked_and_follow_normalisation(tmp_path):
    lines = [
        {
            "text": "  张三在北京工作",
            "entities": [
                {"start": 2, "end": 4, "label": "PER"},
                {"start": 5, "end": 7, "label": "LOC"},
            ],
        },
        {"text": "李四", "entities": [{"start": 0, "end": 5, "label": "PER"}]},
        {
            "text": "王五去上海",
            "entities": [
                {"start": 0, "end": 2, "label": "PER"},
                {"start": 1, "end": 3, "label": "PER"},
            ],
        },
    ]
    data = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode() + b"{oops\n"
    result = run(
        data, "ner", tmp_path, fmt="jsonl", mapping={"text": "text", "entities": "entities"}
    )
    (row,) = rows_of(result)
    assert row["text"] == "张三在北京工作"
    assert [row["text"][e["start"] : e["end"]] for e in row["entities"]] == ["张三", "北京"]
    reasons = {(e["row"], e["reason"]) for e in report_of(result)}
    assert reasons == {(2, "span_outside_text"), (3, "overlapping_spans"), (4, "bad_json")}
    assert result.stats["entities"] == {"PER": 1, "LOC": 1}


def test_multi_label_and_text_pair(csv_bytes, tmp_path):
    multi = csv_bytes(
        [["text", "labels"], ["降息利好股市", "财经|政策"], ["新手机发布", "科技、数码"]]
    )
    result = run(multi, "multi_label", tmp_path / "m")
    assert [r["labels"] for r in rows_of(result)] == [["财经", "政策"], ["科技", "数码"]]
    pair = csv_bytes(
        [["query", "title", "label"], ["怎么办信用卡", "信用卡办理流程", "1"], ["", "x", "0"]]
    )
    result = run(pair, "text_pair", tmp_path / "p")
    assert rows_of(result)[0]["text_a"] == "怎么办信用卡"
    assert [(e["row"], e["column"]) for e in report_of(result)] == [(3, "text_a")]


def test_normalisation_and_duplicates(csv_bytes, tmp_path):
    data = csv_bytes(
        [
            ["text", "label"],
            ["ＡＢＣ１２３", "x"],
            ["ABC123 ", "x"],
            ["e\u0301", "y"],
            ["\u00e9", "y"],
        ]
    )
    kept = run(data, "text_classification", tmp_path / "k", drop_duplicates=False)
    assert kept.rows == 4 and kept.duplicates == 1  # NFC makes é and e+◌́ equal
    dropped = run(data, "text_classification", tmp_path / "d", fullwidth_to_halfwidth=True)
    assert [r["text"] for r in rows_of(dropped)] == ["ABC123", "é"]
    assert dropped.duplicates == 2
    assert {e["action"] for e in report_of(dropped)} == {"dropped"}


def test_same_content_same_hash_and_splits_stable_for_a_seed(csv_bytes, tmp_path):
    rows = [["text", "label"]] + [[f"样本{i}", "ab"[i % 2]] for i in range(200)]
    data = csv_bytes(rows)
    first = run(data, "text_classification", tmp_path / "1", seed=7)
    again = run(data, "text_classification", tmp_path / "2", seed=7)
    other = run(data, "text_classification", tmp_path / "3", seed=8)
    assert first.content_hash == again.content_hash == other.content_hash
    assert rows_of(first) == rows_of(again)
    assert [r["split"] for r in rows_of(first)] != [r["split"] for r in rows_of(other)]
    assert first.split_counts == {"train": 160, "dev": 20, "test": 20}
    per_label = Counter((r["label"], r["split"]) for r in rows_of(first))
    assert per_label == {
        ("a", "train"): 80,
        ("a", "dev"): 10,
        ("a", "test"): 10,
        ("b", "train"): 80,
        ("b", "dev"): 10,
        ("b", "test"): 10,
    }


def test_split_targets_and_assignment_are_exact():
    assert (
        split_targets(7, (0.8, 0.1, 0.1)) == [6, 1, 0]
        or sum(split_targets(7, (0.8, 0.1, 0.1))) == 7
    )
    from array import array

    strata = array("I", [0] * 50 + [1] * 3)
    splits = assign_splits(strata, 2, (0.6, 0.2, 0.2), seed=1)
    assert Counter(splits[:50]) == {0: 30, 1: 10, 2: 10}
    assert sum(Counter(splits[50:]).values()) == 3


def test_strict_mode_and_nothing_valid_fail_the_import(csv_bytes, tmp_path):
    data = csv_bytes([["text", "label"], ["好", "a"], ["", "b"]])
    with pytest.raises(ImportFailed, match="Strict mode"):
        run(data, "text_classification", tmp_path / "s", strict=True)
    assert (tmp_path / "s" / "report.jsonl").read_text()
    with pytest.raises(ImportFailed, match="No valid row"):
        run(csv_bytes([["text"], [""], [" "]]), "text_classification", tmp_path / "e")


def test_missing_mapping_is_a_clear_error(csv_bytes, tmp_path):
    with pytest.raises(ImportFailed, match="required field"):
        run(csv_bytes([["a", "b"], ["x", "y"]]), "text_classification", tmp_path, mapping={})


def test_mapping_is_proposed_from_chinese_and_english_headers():
    schema = task_kinds.get("text_classification")
    assert schema.propose_mapping(["评论内容", "情感"]) == {"text": "评论内容", "label": "情感"}
    assert schema.propose_mapping(["ID", "Text", "Label"]) == {"text": "Text", "label": "Label"}
    assert schema.propose_mapping(["a", "b"]) == {}
    pair = task_kinds.get("text_pair").propose_mapping(["query", "title", "label"])
    assert pair == {"text_a": "query", "text_b": "title", "label": "label"}


def test_multi_label_unknown_labels_are_reported_with_their_row(csv_bytes, tmp_path):
    data = csv_bytes(
        [["text", "labels"], ["降息", "财经|政策"], ["发布会", "科技|娱乐"], ["空", ""]]
    )
    result = run(data, "multi_label", tmp_path, labels=frozenset({"财经", "政策", "科技"}))
    assert [r["labels"] for r in rows_of(result)] == [["财经", "政策"], []]
    (entry,) = report_of(result)
    assert (entry["row"], entry["column"], entry["reason"]) == (3, "labels", "unknown_label")
    assert "娱乐" in entry["message"]
