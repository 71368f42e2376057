"""Evaluation sets (task kind ``evaluation``): C-Eval/CMMLU-shaped multiple-choice rows and open
questions with references, imported from a GBK CSV as teams have them, each bad row reported
by row, column and reason; the Label Studio config and annotations of both shapes."""

import io
import json
import xml.etree.ElementTree as ET

import pytest

from labeling import task_kinds
from labeling.pipeline import ImportOptions, run_import
from labeling.task_kinds.base import RowError
from tests.helpers.data import csv_data

HEADER = ["题目", "A", "B", "C", "D", "答案", "参考答案", "学科"]


def run(rows: list[list[str]], tmp_path, encoding: str = "gbk"):
    schema = task_kinds.get("evaluation")
    return run_import(
        io.BytesIO(csv_data([HEADER, *rows], encoding)),
        fmt="csv",
        encoding=encoding,
        schema=schema,
        options=ImportOptions(mapping=schema.propose_mapping(HEADER)),
        workdir=tmp_path,
    )


def test_choice_and_open_questions_import_and_bad_rows_say_why(tmp_path):
    schema = task_kinds.get("evaluation")
    assert schema.propose_mapping(HEADER) == {
        "question": "题目",
        "A": "A",
        "B": "B",
        "C": "C",
        "D": "D",
        "answer": "答案",
        "references": "参考答案",
        "subject": "学科",
    }
    # An option is only a column of its name: "A" is in "category" and "answer".
    assert schema.propose_mapping(["question", "answer", "category"]) == {
        "question": "question",
        "answer": "answer",
        "subject": "category",
    }
    result = run(
        [
            ["中国的首都是哪里？", "上海", "北京", "广州", "深圳", "B", "", "地理"],
            ["1+1等于几？", "1", "2", "3", "4", "（b）", "", "数学"],
            [
                "请简述光合作用。",
                "",
                "",
                "",
                "",
                "",
                '["植物利用光能合成有机物。", "光合作用"]',
                "生物",
            ],
            ["长江有多长？", "", "", "", "", "约6300公里", "", ""],
            ["没有答案的选择题？", "甲", "乙", "丙", "丁", "", "", ""],  # row 6
            ["答案不在选项中？", "甲", "乙", "丙", "丁", "E", "", ""],  # row 7
            ["少一个选项？", "甲", "乙", "丙", "", "A", "", ""],  # row 8
            ["没有参考答案的问答题？", "", "", "", "", "", "", ""],  # row 9
        ],
        tmp_path,
    )
    rows = [json.loads(line) for line in result.data_path.read_text("utf-8").splitlines()]
    by_question = {r["question"]: r for r in rows}
    assert by_question["中国的首都是哪里？"]["answer"] == "B"
    assert by_question["中国的首都是哪里？"]["subject"] == "地理"
    assert by_question["1+1等于几？"]["answer"] == "B"  # "（b）" names option B
    assert by_question["请简述光合作用。"]["references"] == ["植物利用光能合成有机物。", "光合作用"]
    assert by_question["长江有多长？"]["references"] == ["约6300公里"]  # the answer column
    assert len(rows) == 4 and result.rejected == 4
    report = {
        e["row"]: e for e in map(json.loads, result.report_path.read_text("utf-8").splitlines())
    }
    assert (report[6]["reason"], report[6]["column"]) == ("missing_answer", "answer")
    assert (report[7]["reason"], report[7]["column"]) == ("unknown_answer", "answer")
    assert "“E”" in report[7]["message"]
    assert (report[8]["reason"], report[8]["column"]) == ("missing_option", "D")
    assert report[9]["reason"] == "missing_reference"


def test_label_studio_config_and_annotations_of_both_shapes():
    schema = task_kinds.get("evaluation")
    ET.fromstring(schema.label_config([]))  # well-formed
    choice = {"question": "中国的首都是哪里？", "A": "上海", "B": "北京", "C": "广州", "D": "深圳"}
    assert "B. 北京" in schema.ls_data(choice)["options"]
    picked = [{"type": "choices", "value": {"choices": ["B"]}}]
    assert schema.parse_ls_result(picked, choice, []) == {"answer": "B"}
    with pytest.raises(RowError, match="one correct option"):
        schema.parse_ls_result([], choice, [])
    question = {"question": "请简述光合作用。"}
    written = [{"type": "textarea", "value": {"text": ["植物利用光能合成有机物"]}}]
    assert schema.parse_ls_result(written, question, []) == {
        "references": ["植物利用光能合成有机物"]
    }
    assert schema.ls_result({**choice, "answer": "B"})[0]["value"] == {"choices": ["B"]}
