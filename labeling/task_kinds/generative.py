"""The generative kinds, whose model generates text (a causal LM): no labels but answers.

- ``instruction``: a row is ``messages``, the chat normal form
  (``[{"role": "system"|"user"|"assistant", "content"}]``, which Alpaca and ShareGPT records are
  converted to; a conversation that ends on the user's turn awaits its response), and an
  optional ``rating`` (1–5). In Label Studio the response is written or corrected, and rated.
- ``preference`` (for DPO): a row is ``prompt``, ``chosen`` and ``rejected``; a pair not yet
  judged has ``response_a`` and ``response_b`` instead. In Label Studio the better of the two is
  chosen.
"""

from abc import abstractmethod

from django.utils.translation import gettext_lazy as _

from labeling.normalize import Normalizer
from labeling.task_kinds.base import Field, Kind, RowError, clean_text, parse_json
from runtime.chat import ROLES
from runtime.kinds import TaskKind

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


def preference_pair(row: dict) -> tuple[str, str]:
    """The two responses as Label Studio shows them: chosen first when judged."""
    if row.get("chosen"):
        return row["chosen"], row["rejected"]
    return row["response_a"], row["response_b"]


class Generative(Kind):
    """A kind with answers rather than labels: a row's text is all of its fields (dedup,
    search), and it is labeled once it has its answer."""

    label_field = None
    takes_labels = False

    @abstractmethod
    def dedup_key(self, row: dict) -> str: ...

    @abstractmethod
    def is_labeled(self, row: dict) -> bool: ...

    def text_length(self, row: dict) -> int:
        return len(self.dedup_key(row))

    def row_labels(self, row: dict) -> list[str]:
        return []


class Instruction(Generative):
    kind = TaskKind.INSTRUCTION
    label = _("Instruction tuning (指令微调)")
    fields = (
        Field("messages", False, ("conversations", "对话", "dialogue", "chat")),
        # The Alpaca format: instruction, optional input, output.
        Field("instruction", False, ("指令", "prompt", "question", "问题", "query")),
        Field("input", False, ("输入", "context", "上下文")),
        Field("output", False, ("输出", "response", "answer", "回答", "答案")),
        Field("system", False, ("系统", "system_prompt")),
        # An annotator's 1–5 rating of the response (Label Studio's Rating).
        Field("rating", False, ("评分",)),
    )
    text_fields = ("messages",)

    def row_fields(self) -> list[str]:
        return ["messages", "rating"]  # a stored row keeps only its messages (and rating)

    def build_row(self, record: dict, norm: Normalizer, labels: frozenset[str] | None) -> dict:
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

    def is_labeled(self, row: dict) -> bool:
        return row["messages"][-1]["role"] == "assistant"

    def dedup_key(self, row: dict) -> str:
        return "\x1f".join(f"{t['role']}:{t['content']}" for t in row["messages"])

    def label_config(self, labels: list[str]) -> str:
        # The conversation so far, the response to write or correct, and a rating of it.
        return (
            '<View><Header value="请阅读对话，撰写或修改助手的回答，并为回答打分"/>'
            '<Paragraphs name="dialogue" value="$dialogue" layout="dialogue" nameKey="role" '
            'textKey="content"/>'
            '<TextArea name="response" toName="dialogue" editable="true" maxSubmissions="1" '
            'rows="6" required="true" placeholder="助手的回答"/>'
            '<Rating name="rating" toName="dialogue" maxRating="5"/></View>'
        )

    def ls_data(self, row: dict) -> dict:
        return {"dialogue": prompt_turns(row["messages"])}

    def ls_result(self, row: dict) -> list[dict]:
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

    def parse_ls_result(self, result: list[dict], row: dict, labels: list[str]) -> dict:
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
            (item.get("value") or {}).get("rating")
            for item in result
            if item.get("type") == "rating"
        ]
        if ratings and isinstance(ratings[-1], int):
            value["rating"] = ratings[-1]
        return value

    def note(self, row: dict) -> RowError | None:
        if self.is_labeled(row):
            return None
        return RowError(
            "no_assistant_turn",
            "messages",
            _("No assistant turn: kept without a response, for labeling."),
        )


class Preference(Generative):
    kind = TaskKind.PREFERENCE
    label = _("Preference pairs (偏好数据)")
    fields = (
        Field("prompt", True, ("instruction", "question", "问题", "指令", "query")),
        Field("chosen", False, ("优选", "better", "good", "好的回答")),
        Field("rejected", False, ("劣选", "worse", "bad", "差的回答")),
        Field("response_a", False, ("回答A", "answer_a", "output_a")),
        Field("response_b", False, ("回答B", "answer_b", "output_b")),
    )
    text_fields = ("prompt",)

    def build_row(self, record: dict, norm: Normalizer, labels: frozenset[str] | None) -> dict:
        prompt = _json_value(record.get("prompt"), "prompt")
        if isinstance(prompt, list):  # a conversation: its last user turn is the prompt
            users = [
                t.get("content") for t in prompt if isinstance(t, dict) and t.get("role") == "user"
            ]
            prompt = users[-1] if users else ""
        row = {"prompt": clean_text({"prompt": prompt}, "prompt", norm)}
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
                _(
                    "Give chosen and rejected, or two responses to compare (response_a, "
                    "response_b)."
                ),
            )
        if a == b:
            raise RowError("same_responses", "response_b", _("The two responses are the same."))
        return {**row, "response_a": a, "response_b": b}

    def is_labeled(self, row: dict) -> bool:
        return bool(row.get("chosen"))

    def dedup_key(self, row: dict) -> str:
        a, b = sorted(preference_pair(row))
        return "\x1f".join((row["prompt"], a, b))

    def label_config(self, labels: list[str]) -> str:
        return (
            '<View><Header value="请阅读问题，选择更好的回答"/>'
            '<Text name="prompt" value="$prompt"/>'
            '<Pairwise name="preference" toName="response_a,response_b"/>'
            '<View style="display: flex; gap: 1em;">'
            '<View style="flex: 1;"><Header value="回答 A" size="6"/>'
            '<Text name="response_a" value="$response_a"/></View>'
            '<View style="flex: 1;"><Header value="回答 B" size="6"/>'
            '<Text name="response_b" value="$response_b"/></View></View></View>'
        )

    def ls_data(self, row: dict) -> dict:
        a, b = preference_pair(row)
        return {"prompt": row["prompt"], "response_a": a, "response_b": b}

    def ls_result(self, row: dict) -> list[dict]:
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

    def parse_ls_result(self, result: list[dict], row: dict, labels: list[str]) -> dict:
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

    def note(self, row: dict) -> RowError | None:
        if self.is_labeled(row):
            return None
        return RowError(
            "not_judged",
            "chosen",
            _("No chosen and rejected response: kept as a pair to compare, for labeling."),
        )
