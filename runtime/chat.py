"""The text side of chat models, framework-free: a causal LM's tokenizer and chat template read
from its own files, conversations → token ids with the loss on assistant tokens only, and
preference pairs → prompt and response ids.

Training (paddle and torch), evaluation and the serving host all use this module, so that a
conversation is rendered and tokenised alike everywhere. A model's tokenizer is its
``tokenizer.json`` (the fast-tokenizer format that PaddleNLP and transformers both read); its
chat template comes from ``chat_template.jinja``, ``chat_template.json`` or
``tokenizer_config.json``, and none is assumed. Templates are rendered in the bounded sandbox
of ``runtime.chat_template``.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from runtime.chat_template import (
    ChatTemplateError,
    ChatTemplateTooCostly,
    compile_template,
    render_bounded,
)
from runtime.data import IGNORE

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "generation_config.json",
)
# The roles of a conversation (the instruction kind's normal form).
ROLES = ("system", "user", "assistant")

# The preset's template: ChatML, as Qwen2 and many Chinese chat models use.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PRESET_SPECIALS = ("<pad>", "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class ChatTokenizer:
    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: the model has no tokenizer.json (the fast-tokenizer file); convert a "
                "sentencepiece tokenizer with transformers before importing it"
            )
        self.tokenizer = Tokenizer.from_file(str(path))
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text("utf-8")) if config_path.exists() else {}
        self.template = _read_template(directory, config)
        self.bos_token = _token_text(config.get("bos_token")) or ""
        self.eos_token = _token_text(config.get("eos_token")) or ""
        pad = _token_text(config.get("pad_token")) or self.eos_token
        self.pad_id = self.tokenizer.token_to_id(pad) if pad else 0
        self.pad_id = 0 if self.pad_id is None else self.pad_id
        self.stop_ids = sorted(_stop_ids(self, directory))
        self.max_length = config.get("model_max_length")
        self._compiled = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The conversation as the model's own chat template writes it."""
        if self._compiled is None:
            self._compiled = compile_template(self.template)
        return render_bounded(
            self._compiled,
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """A conversation up to the assistant's turn that is to be generated."""
        return self.encode(self.render(messages, add_generation_prompt=True))


def _samples() -> list[list[dict]]:
    """Conversations a template is tried on at import: 1, 2, 5 and 9 turns, with a system
    prompt and a tool's turn (a template may refuse roles it does not know)."""
    user, answer = {"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！"}
    system = {"role": "system", "content": "你是一个助手。"}
    tool = {"role": "tool", "content": '{"result": 42}'}
    return [
        [user],
        [user, answer],
        [system, user, answer, user, answer],
        [system, user, answer, user, answer, tool, answer, user, answer],
    ]


def check_template(directory: Path) -> None:
    """Raise ChatTemplateTooCostly if the model's chat template does not render a few sample
    conversations (1 to 9 turns, system and tool roles) within the bounds (at import: before
    any job or endpoint renders it). A template that refuses a sample for its own reasons
    (raise_exception, a role it does not know) is not judged on that sample."""
    from jinja2 import TemplateError

    config_path = Path(directory) / "tokenizer_config.json"
    config = json.loads(config_path.read_text("utf-8")) if config_path.exists() else {}
    template = compile_template(_read_template(Path(directory), config))
    for sample in _samples():
        for prompt in (True, False):
            try:
                render_bounded(
                    template,
                    messages=sample,
                    add_generation_prompt=prompt,
                    bos_token="",
                    eos_token="",
                )
            except ChatTemplateTooCostly:
                raise
            except (ChatTemplateError, TemplateError, TypeError, ValueError):
                pass


def _read_template(directory: Path, config: dict) -> str:
    jinja = directory / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text("utf-8")
    as_json = directory / "chat_template.json"
    if as_json.exists():
        template = json.loads(as_json.read_text("utf-8")).get("chat_template")
    else:
        template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if not template:
        raise ChatTemplateError(
            f"{directory}: the model has no chat template (chat_template.jinja, "
            "chat_template.json or chat_template in tokenizer_config.json); none is assumed"
        )
    return template


def _stop_ids(tok: ChatTokenizer, directory: Path) -> set[int]:
    """Where generation ends: the end-of-text token and the generation config's stops."""
    ids: set[int] = set()
    if tok.eos_token and tok.tokenizer.token_to_id(tok.eos_token) is not None:
        ids.add(tok.tokenizer.token_to_id(tok.eos_token))
    generation = directory / "generation_config.json"
    if generation.exists():
        eos = json.loads(generation.read_text("utf-8")).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    # Chat templates end a turn with their own token, which the model learns to emit (GLM's
    # assistant turn ends where the next user turn starts).
    for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_sentence|>", "<|user|>"):
        found = tok.tokenizer.token_to_id(token)
        if found is not None and token in tok.template:
            ids.add(found)
    return ids


def build_char_tokenizer(
    texts,
    directory: Path,
    *,
    template: str = CHATML,
    specials: tuple[str, ...] = PRESET_SPECIALS,
    end_of_turn: str = "<|im_end|>",
) -> ChatTokenizer:
    """The preset's tokenizer: one token per character of ``texts``, the special tokens and
    the chat template (ChatML), written as a fast tokenizer that PaddleNLP and transformers
    load. (A model's own template and special tokens in its place: the tests' tiny models of
    each architecture.)"""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = tuple(dict.fromkeys([*PRESET_SPECIALS[:4], *specials]))
    chars = sorted({c for text in texts for c in text} | set("\n"))
    vocab = {token: i for i, token in enumerate(specials)}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    unknown = "<unk>"
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(specials))
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "LlamaTokenizerFast",
        "bos_token": "<s>",
        "eos_token": end_of_turn,
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "padding_side": "left",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 512,
        # PaddleNLP reads the template here or from chat_template.json; transformers from
        # either and from chat_template.jinja.
        "chat_template": template,
    }
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config, ensure_ascii=False, indent=1), "utf-8"
    )
    return ChatTokenizer(directory)


def copy_tokenizer(source: Path, target: Path) -> None:
    import shutil

    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, target / name)


# -- Examples ---------------------------------------------------------------------------------


@dataclass
class SftExample:
    input_ids: list[int]
    labels: list[int]  # IGNORE where no loss is taken (everything but assistant tokens)


@dataclass
class PreferenceExample:
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]


def sft_example(tok: ChatTokenizer, messages: list[dict]) -> SftExample:
    """Token ids of a conversation, with the loss on the assistant's turns only. The template
    must write each turn as an extension of the turns before it."""
    ids: list[int] = []
    labels: list[int] = []
    done = ""
    for i, turn in enumerate(messages):
        if turn["role"] != "assistant":
            continue
        prompt = tok.render(messages[:i], add_generation_prompt=True)
        full = tok.render(messages[: i + 1], add_generation_prompt=False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise ChatTemplateError(
                "the chat template does not write a conversation turn by turn, so the "
                "assistant's tokens cannot be told apart"
            )
        context = tok.encode(prompt[len(done) :])
        answer = tok.encode(full[len(prompt) :])
        ids += context + answer
        labels += [IGNORE] * len(context) + answer
        done = full
    return SftExample(ids, labels)


def preference_example(tok: ChatTokenizer, row: dict) -> PreferenceExample:
    conversation = [{"role": "user", "content": row["prompt"]}]
    prompt = tok.render(conversation, add_generation_prompt=True)

    def response(text: str) -> list[int]:
        full = tok.render(
            [*conversation, {"role": "assistant", "content": text}], add_generation_prompt=False
        )
        if not full.startswith(prompt):
            raise ChatTemplateError("the chat template does not extend the prompt with a reply")
        return tok.encode(full[len(prompt) :])

    return PreferenceExample(tok.encode(prompt), response(row["chosen"]), response(row["rejected"]))


def encode_row(task_kind: str, tok: ChatTokenizer, row: dict):
    """A row's example and its length in tokens (a preference pair: the prompt and the longer
    response), which the token limit applies to."""
    if task_kind == "instruction":
        ex = sft_example(tok, row["messages"])
        return ex, len(ex.input_ids)
    pair = preference_example(tok, row)
    return pair, len(pair.prompt) + max(len(pair.chosen), len(pair.rejected))


def pack(examples: list[SftExample], max_length: int) -> list[SftExample]:
    """Several short conversations in one sequence of at most ``max_length`` tokens (first fit,
    in order), so that fewer positions are padding."""
    packed: list[SftExample] = []
    for ex in examples:
        if packed and len(packed[-1].input_ids) + len(ex.input_ids) <= max_length:
            packed[-1].input_ids += ex.input_ids
            packed[-1].labels += ex.labels
        else:
            packed.append(SftExample(list(ex.input_ids), list(ex.labels)))
    return packed
