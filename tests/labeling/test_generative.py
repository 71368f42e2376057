"""The generative task kinds: instruction (chat, Alpaca and ShareGPT records to one normal form,
validated per row) and preference pairs, their Label Studio configs and annotations, and how
several annotators' answers become one."""

import io
import json
import xml.etree.ElementTree as ET

import pytest

from labeling import consensus, task_kinds
from labeling.pipeline import ImportOptions, run_import
from labeling.task_kinds.base import RowError
from tests.helpers.label_studio import needs_label_studio


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


def run(records: list[dict], kind: str, tmp_path, **options):
    schema = task_kinds.get(kind)
    columns = sorted({k for r in records for k in r})
    return run_import(
        io.BytesIO(jsonl(records)),
        fmt="jsonl",
        encoding="utf-8",
        schema=schema,
        options=ImportOptions(mapping=schema.propose_mapping(columns), **options),
        workdir=tmp_path,
    )


def rows_of(result) -> list[dict]:
    return [json.loads(line) for line in result.data_path.read_text("utf-8").splitlines()]


def report_of(result) -> dict[int, dict]:
    lines = result.report_path.read_text("utf-8").splitlines()
    return {e["row"]: e for e in map(json.loads, lines)}


CHAT = {
    "messages": [
        {"role": "system", "content": "你是银行客服。"},
        {"role": "user", "content": "信用卡怎么还款？"},
        {"role": "assistant", "content": "可以在手机银行还款。"},
    ]
}


def test_chat_alpaca_and_sharegpt_records_become_one_normal_form(tmp_path):
    records = [
        CHAT,
        {"instruction": "把下面的句子翻译成英文", "input": "今天天气很好", "output": "Nice day."},
    ]
    result = run(records, "instruction", tmp_path / "mixed")
    sharegpt = {
        "conversations": [
            {"from": "human", "value": "你好"},
            {"from": "gpt", "value": "您好，请问有什么可以帮您？"},
        ]
    }
    rows = rows_of(result) + rows_of(run([sharegpt], "instruction", tmp_path / "sharegpt"))
    assert [r["messages"] for r in rows] == [
        CHAT["messages"],
        [
            {"role": "user", "content": "把下面的句子翻译成英文\n今天天气很好"},
            {"role": "assistant", "content": "Nice day."},
        ],
        [
            {"role": "user", "content": "你好"},
            {"role": "assistant", "content": "您好，请问有什么可以帮您？"},
        ],
    ]
    assert result.rejected == 0 and result.stats["unlabeled"] == 0
    assert set(rows[0]) == {"messages", "split"}


def test_each_bad_conversation_is_reported_by_row_and_reason(tmp_path):
    good = CHAT
    records = [
        good,
        {"messages": [{"role": "assistant", "content": "先说"}, {"role": "user", "content": "嗯"}]},
        {"messages": [{"role": "user", "content": "问"}, {"role": "assistant", "content": "  "}]},
        {"messages": [{"role": "user", "content": "问"}, {"role": "user", "content": "又问"}]},
        {"messages": [{"role": "robot", "content": "你好"}]},
        {"messages": "不是列表"},
        {"instruction": "", "output": "没有问题的回答"},
        # Awaiting its response: kept for labeling, and the report says so.
        {"messages": [{"role": "user", "content": "请写一首关于秋天的诗"}]},
        {**good, "rating": 9},
        {"instruction": "问好", "output": "你好！", "rating": "4"},
    ]
    result = run(records, "instruction", tmp_path)
    report = report_of(result)
    reasons = {row: (e["reason"], e["action"]) for row, e in report.items()}
    assert reasons == {
        2: ("roles_out_of_order", "rejected"),
        3: ("empty_turn", "rejected"),
        4: ("roles_out_of_order", "rejected"),
        5: ("unknown_role", "rejected"),
        6: ("bad_messages", "rejected"),
        7: ("empty_turn", "rejected"),
        8: ("no_assistant_turn", "kept"),
        9: ("bad_rating", "rejected"),
    }
    assert "Turn 2" in report[3]["message"] and "Turn 1" in report[2]["message"]
    assert result.rows == 3 and result.stats["unlabeled"] == 1
    assert rows_of(result)[2]["rating"] == 4


def test_preference_pairs_judged_and_to_judge(tmp_path):
    records = [
        {"prompt": "推荐一本书", "chosen": "《红楼梦》，因为……", "rejected": "不知道"},
        {"prompt": "解释利率", "response_a": "利率是借钱的价格。", "response_b": "略"},
        {"prompt": "只有一个回答", "chosen": "有"},
        {"prompt": "一样的回答", "chosen": "同", "rejected": "同"},
        {"prompt": "", "chosen": "a", "rejected": "b"},
    ]
    result = run(records, "preference", tmp_path)
    rows = rows_of(result)
    assert {k: v for k, v in rows[0].items() if k != "split"} == records[0]
    assert rows[1]["response_a"] == "利率是借钱的价格。" and "chosen" not in rows[1]
    reasons = {row: e["reason"] for row, e in report_of(result).items()}
    assert reasons == {2: "not_judged", 3: "empty_turn", 4: "same_responses", 5: "empty_text"}
    assert result.stats["unlabeled"] == 1


def test_label_studio_configs_are_valid_xml_naming_the_task_data():
    instruction, preference = task_kinds.get("instruction"), task_kinds.get("preference")
    root = ET.fromstring(instruction.label_config([]))
    assert root.find("Paragraphs").get("value") == "$dialogue"
    assert root.find("TextArea").get("toName") == "dialogue"
    assert root.find("Rating") is not None
    root = ET.fromstring(preference.label_config([]))
    assert root.find("Pairwise").get("toName") == "response_a,response_b"
    row = {"prompt": "问", "response_a": "甲", "response_b": "乙"}
    assert preference.ls_data(row) == {"prompt": "问", "response_a": "甲", "response_b": "乙"}


def test_a_written_response_completes_or_corrects_the_conversation():
    schema = task_kinds.get("instruction")
    waiting = {"messages": [{"role": "user", "content": "请写一首诗"}]}
    assert schema.ls_data(waiting) == {"dialogue": waiting["messages"]}
    assert schema.ls_result(waiting) == []
    result = [
        {"type": "textarea", "from_name": "response", "value": {"text": ["秋风起，落叶黄。"]}},
        {"type": "rating", "from_name": "rating", "value": {"rating": 4}},
    ]
    value = schema.parse_ls_result(result, waiting, [])
    assert value == {
        "messages": [
            {"role": "user", "content": "请写一首诗"},
            {"role": "assistant", "content": "秋风起，落叶黄。"},
        ],
        "rating": 4,
    }
    # A drafted response shows as a prediction, and a correction replaces it.
    drafted = {"messages": value["messages"]}
    assert schema.ls_data(drafted) == {"dialogue": waiting["messages"]}
    assert schema.ls_result(drafted)[0]["value"] == {"text": ["秋风起，落叶黄。"]}
    corrected = schema.parse_ls_result(
        [{"type": "textarea", "value": {"text": ["秋风起兮白云飞。"]}}], drafted, []
    )
    assert corrected["messages"][-1]["content"] == "秋风起兮白云飞。"
    assert len(corrected["messages"]) == 2
    with pytest.raises(RowError, match="empty"):
        schema.parse_ls_result([{"type": "textarea", "value": {"text": [" "]}}], waiting, [])


def test_a_pairwise_choice_names_chosen_and_rejected():
    schema = task_kinds.get("preference")
    pair = {"prompt": "问", "response_a": "甲", "response_b": "乙"}
    right = [{"type": "pairwise", "value": {"selected": "right"}}]
    assert schema.parse_ls_result(right, pair, []) == {"chosen": "乙", "rejected": "甲"}
    judged = {"prompt": "问", "chosen": "乙", "rejected": "甲"}
    # A judged pair shows chosen on the left, as a prediction to review.
    assert schema.ls_data(judged)["response_a"] == "乙"
    assert schema.parse_ls_result(schema.ls_result(judged), judged, []) == {
        "chosen": "乙",
        "rejected": "甲",
    }
    with pytest.raises(RowError):
        schema.parse_ls_result([], pair, [])


def test_answers_of_several_annotators_become_one():
    a = {"chosen": "甲", "rejected": "乙"}
    b = {"chosen": "乙", "rejected": "甲"}
    assert consensus.resolve([("x", a), ("y", a), ("z", b)], "majority") == a
    assert consensus.resolve([("x", a), ("y", b)], "majority") is None
    assert consensus.resolve([("x", a), ("y", b)], "reviewer", "y") == b
    question = {"role": "user", "content": "问"}
    first = {"messages": [question, {"role": "assistant", "content": "一"}]}
    later = {"messages": [question, {"role": "assistant", "content": "二"}]}
    # Written responses rarely agree to the letter: the latest stands unless a rule says else.
    assert consensus.resolve([("x", first), ("y", later)], "majority") == later
    assert consensus.resolve([("x", first), ("y", later)], "drop") is None
    assert (
        consensus.agreement({1: [("x", a), ("y", a)], 2: [("x", a), ("y", b)]}, "preference")[
            "pairs"
        ][0]["items"]
        == 2
    )


@needs_label_studio
def test_responses_and_choices_made_in_label_studio_export_as_versions(owner, team):
    """Annotators write a response (and rate it) and pick the better of two responses in the
    real Label Studio; the exports are an instruction and a preference version."""
    from django.core.files.storage import default_storage

    from labeling.datasets import dataset_create
    from labeling.exports import labeling_project_export
    from labeling.imports import import_run
    from labeling.sync import labeling_project_sync
    from tests.helpers.data import make_jsonl_version
    from tests.helpers.label_studio import annotate, push_project, region, task_ids

    def exported_rows(kind: str, row: dict, result: list[dict]) -> list[dict]:
        """The export of a labeling project of ``row`` (in a new dataset of ``kind``), once an
        annotator has given it ``result``."""
        dataset = dataset_create(actor=owner, team=team, name=kind, task_kind=kind)
        version = make_jsonl_version(dataset, owner, [row], {k: k for k in row})
        project = push_project(owner, version, kind)
        annotate(team, owner, task_ids(project)[1], result)
        labeling_project_sync(project.pk)
        job = labeling_project_export(actor=owner, project=project, rule="majority")
        job = import_run(job.pk)
        assert job.version is not None, job.error
        with default_storage.open(job.version.data_file, "rb") as f:
            return [json.loads(line) for line in f]

    waiting = {"messages": [{"role": "user", "content": "写一句秋天的诗"}]}
    response = [
        region("response", "dialogue", "textarea", {"text": ["秋风起兮白云飞。"]}),
        region("rating", "dialogue", "rating", {"rating": 5}),
    ]
    rows = exported_rows("instruction", waiting, response)
    assert rows[0]["messages"] == [
        *waiting["messages"],
        {"role": "assistant", "content": "秋风起兮白云飞。"},
    ]
    assert rows[0]["rating"] == 5  # the annotator's rating travels with the response

    pair = {"prompt": "推荐一本书", "response_a": "不知道", "response_b": "《红楼梦》"}
    picked = [region("preference", "response_a", "pairwise", {"selected": "right"})]
    rows = exported_rows("preference", pair, picked)
    assert {k: rows[0][k] for k in ("prompt", "chosen", "rejected")} == {
        "prompt": "推荐一本书",
        "chosen": "《红楼梦》",
        "rejected": "不知道",
    }
    assert "response_a" not in rows[0]
