"""The text side of chat models, framework-free: a causal LM's tokenizer and chat template read
from its own files, conversations → token ids with the loss on assistant tokens only, preference
pairs → prompt and response ids, and the character-level ROUGE-L of Chinese generations.

Training (paddle and torch), evaluation and the serving host all use this module, so that a
conversation is rendered and tokenised alike everywhere. A model's tokenizer is its
``tokenizer.json`` (the fast-tokenizer format that PaddleNLP and transformers both read); its
chat template comes from ``chat_template.jinja``, ``chat_template.json`` or
``tokenizer_config.json``, and none is assumed.
"""

import json
import re
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


class ChatTemplateError(ValueError):
    pass


# What one rendering of a chat template may do (a model's template is an uploaded file): loop
# iterations and calls, range() sizes, the size of any value a call, filter or operator takes or
# makes (checked before it is made, from its inputs), the characters all calls and filters
# process together (their work), and the length of the output. A template over any of them is
# stopped with ChatTemplateError, within a fraction of a second and a few megabytes.
TEMPLATE_MAX_STEPS = 100_000
TEMPLATE_MAX_RANGE = 10_000
TEMPLATE_MAX_OUTPUT = 1_000_000  # characters
TEMPLATE_MAX_VALUE = TEMPLATE_MAX_OUTPUT  # characters and items in one value
TEMPLATE_MAX_WORK = 10_000_000  # characters and items taken and made by calls, in one rendering
# One rendering's counts (steps, output, work) and the ids of the containers it was given.
_budget: ContextVar[list[Any]] = ContextVar("chat_template_budget")


class ChatTemplateTooCostly(ChatTemplateError):
    """A template stopped for going over the bounds of one rendering."""


def _over(what: str, limit: int) -> ChatTemplateError:
    return ChatTemplateTooCostly(
        f"the chat template was stopped: it went over {limit:,} {what} in one rendering "
        "(a chat template renders a conversation in bounded work)"
    )


def _step(n: int = 1) -> None:
    budget = _budget.get()
    budget[0] += n
    if budget[0] > TEMPLATE_MAX_STEPS:
        raise _over("loop iterations and calls", TEMPLATE_MAX_STEPS)


def _size(value, limit: int = TEMPLATE_MAX_VALUE) -> int:
    """The characters and items of ``value`` (nested containers' too), counted until they go
    over ``limit``: what a call taking it processes, what printing it writes."""
    if isinstance(value, str | bytes):
        return len(value)
    if not isinstance(value, list | tuple | dict | set | frozenset):
        return 1
    if not isinstance(value, dict):  # flat lists in C: a million characters in milliseconds
        kinds = set(map(type, value))
        if kinds <= {int, float, bool, type(None)}:
            return len(value)
        if kinds == {str}:
            return len(value) + sum(map(len, value))
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += len(item)
        elif isinstance(item, dict):
            total += len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            total += len(item)
            stack.extend(item)
        else:
            total += 1
    return total


def _work(n: int) -> None:
    budget = _budget.get()
    budget[2] += n
    if budget[2] > TEMPLATE_MAX_WORK:
        raise _over("characters processed by calls and filters", TEMPLATE_MAX_WORK)


def _taken(*values) -> None:
    """Before a call or filter: none of its inputs is over the bound of one value, and their
    size counts towards the work (99,000 ``s.upper()`` on a long ``s`` stop early)."""
    total = 1
    inputs = _budget.get()[3]
    for value in values:
        n = _size(value)
        if n > TEMPLATE_MAX_VALUE:
            raise _over("characters or items in one value given to a call", TEMPLATE_MAX_VALUE)
        # The conversation given to the template counts by its items (``messages|length`` in
        # a loop over a long conversation is cheap); what the template made, by its size.
        total += len(value) if id(value) in inputs else n
    _work(total)


def _would_make(n: int, what: str) -> None:
    """Before a call that may make a large value from small inputs: its estimated size."""
    if n > TEMPLATE_MAX_VALUE:
        raise _over(f"characters or items made by {what}", TEMPLATE_MAX_VALUE)
    _work(n)


def _made(value):
    """After a call or filter: the value it made, within the bound and counted as work."""
    n = _size(value)
    if n > TEMPLATE_MAX_VALUE:
        raise _over("characters or items in one value", TEMPLATE_MAX_VALUE)
    _work(n)
    return value


def _counted_output(value):
    """Jinja's ``finalize``: every ``{{ … }}`` counts towards the output's bound, also where
    its text is captured (``{% set x %}…{% endset %}``, macros) rather than written out. The
    value's size is checked before it is turned into text (a list of a million long strings)."""
    budget = _budget.get()
    if value is not None:
        if budget[1] + _size(value, TEMPLATE_MAX_OUTPUT) > TEMPLATE_MAX_OUTPUT:
            raise _over("characters of output", TEMPLATE_MAX_OUTPUT)
        budget[1] += len(str(value))
    if budget[1] > TEMPLATE_MAX_OUTPUT:
        raise _over("characters of output", TEMPLATE_MAX_OUTPUT)
    return value


def _bounded(iterable):
    """Every loop of a template iterates through this (the template's syntax tree is rewritten
    so): one step per item."""
    for item in iterable:
        _step()
        yield item


def _bounded_range(*args: int) -> range:
    r = range(*args)
    if len(r) > TEMPLATE_MAX_RANGE:
        raise _over("items in a range()", TEMPLATE_MAX_RANGE)
    return r


def _check_size(value):
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > TEMPLATE_MAX_OUTPUT:
        raise _over("characters (a number given as a size)", TEMPLATE_MAX_OUTPUT)
    return value


def _check_format(value):
    """A format string may not ask for a width or precision of millions ("%999999999d")."""
    if isinstance(value, str) and _HUGE_NUMBER.search(value):
        raise _over("characters (a width in a format string)", TEMPLATE_MAX_OUTPUT)
    return value


_HUGE_NUMBER = re.compile(r"\d{7,}")
_NUMBER = re.compile(r"\d+")


def _format_estimate(fmt: str, values) -> None:
    """``fmt`` formatted with ``values`` ("{}" or "%s" fields): at most its length plus, per
    field, the widest width and the largest value (an int given may be a width)."""
    _check_format(fmt)
    fields = fmt.count("{") + fmt.count("%")
    width = max((int(n) for n in _NUMBER.findall(fmt)), default=0)
    largest = 0
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            largest = max(largest, abs(value))
        else:
            largest = max(largest, _size(value))
    _would_make(len(fmt) + fields * (width + largest), "a format")


def _items(value):
    return value.values() if isinstance(value, dict) else value


def _join_estimate(separator: str, items: list) -> None:
    total = len(separator) * len(items)
    for item in items:
        total += _size(item)
        if total > TEMPLATE_MAX_VALUE:
            break
    _would_make(total, "a join")


def _replace_estimate(s, old, new, count=-1) -> None:
    if not all(isinstance(v, str) for v in (s, old, new)):
        return
    found = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    _would_make(len(s) + found * len(new), "a replace")


def _str_call(s: str, name: str, args: tuple, kwargs: dict) -> tuple:
    """Before a method of a string that makes more than it takes: its result's size. Returns
    the arguments to call with (an iterable to join, read once into a list)."""
    if name == "join" and args:
        items = list(_bounded(args[0]))
        _join_estimate(s, items)
        return (items, *args[1:])
    if name == "replace" and len(args) >= 2:
        _replace_estimate(s, *args[:3])
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            _would_make(len(s) + s.count("\t") * max(size, 0), "expandtabs")
    elif name == "translate" and args and isinstance(args[0], dict):
        largest = max((_size(v) for v in args[0].values()), default=1)
        _would_make(len(s) * max(largest, 1), "a translate")
    return args


def _counted(value):
    """An operand of a comparison: taken like a call's argument (``sandbox.call`` counts it)."""
    return value


def _bounded_slice(value, start, stop, step):
    """``value[start:stop:step]``, called through the sandbox (which counts ``value``)."""
    return value[start:stop:step]


def _bounded_concat(*parts) -> str:
    """The template's ``~``: its parts joined, within the output's bound."""
    _would_make(sum(_size(p) for p in parts), "`~`")
    return _made("".join(str(p) for p in parts))


def bounded_environment():
    """Jinja's immutable sandbox, with the bounds above."""
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    class Bound(NodeTransformer):
        """Every loop iterates through ``_bounded``; every ``~`` is ``_bounded_concat``."""

        def visit_For(self, node):
            self.generic_visit(node)
            name = nodes.Name("__bounded_loop", "load")
            node.iter = nodes.Call(name, [node.iter], [], None, None)
            return node

        def visit_Concat(self, node):
            self.generic_visit(node)
            name = nodes.Name("__bounded_concat", "load")
            return nodes.Call(name, node.nodes, [], None, None, lineno=node.lineno)

        def visit_Getitem(self, node):
            """``s[::-1]`` (Python's own slicing in the compiled template) is a counted call."""
            self.generic_visit(node)
            if not isinstance(node.arg, nodes.Slice):
                return node
            arg = node.arg
            bounds = [b or nodes.Const(None) for b in (arg.start, arg.stop, arg.step)]
            name = nodes.Name("__bounded_slice", "load")
            return nodes.Call(name, [node.node, *bounds], [], None, None, lineno=node.lineno)

        def visit_Compare(self, node):
            """``'b' in s``, ``s == t``: their operands' sizes count as work."""
            self.generic_visit(node)
            name = nodes.Name("__counted", "load")
            node.expr = nodes.Call(name, [node.expr], [], None, None, lineno=node.lineno)
            for operand in node.ops:
                operand.expr = nodes.Call(name, [operand.expr], [], None, None)
            return node

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, int) and right > 64:
                raise _over("for an exponent", 64)
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, str | list | tuple) and isinstance(n, int):
                        _would_make(_size(seq) * n, "`*`")
            if operator == "+" and isinstance(left, str | list | tuple):
                _would_make(_size(left) + _size(right), "`+`")
            if operator == "%" and isinstance(left, str):
                _format_estimate(left, right if isinstance(right, tuple) else (right,))
            return _made(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):
            _step()
            receiver = getattr(__obj, "__self__", None)
            _taken(receiver if isinstance(receiver, str | list | tuple | dict) else None, *args)
            _taken(*kwargs.values())
            for value in (*args, *kwargs.values()):
                _check_size(value)
            if isinstance(receiver, str):
                args = _str_call(receiver, getattr(__obj, "__name__", ""), args, kwargs)
            return _made(super().call(__context, __obj, *args, **kwargs))

        def wrap_str_format(self, value):
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt, is_map = value.__self__, value.__name__ == "format_map"

            def bounded_format(*args, **kwargs):  # "{:>999999}{:>999999}…".format(…)
                values = [*args, *kwargs.values()]
                if is_map and args:
                    values = list(_items(args[0]))
                _format_estimate(fmt, values)
                return wrapped(*args, **kwargs)

            return bounded_format

        def _parse(self, source, name, filename):
            return Bound().visit(super()._parse(source, name, filename))

    env = Bounded(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols"],
        finalize=_counted_output,
    )
    env.globals["range"] = _bounded_range
    env.globals["__bounded_loop"] = _bounded
    env.globals["__bounded_concat"] = _bounded_concat
    env.globals["__counted"] = _counted
    env.globals["__bounded_slice"] = _bounded_slice
    env.globals.pop("lipsum", None)  # lipsum(999999) writes a million paragraphs
    # Filters take sizes too ("x"|center(10**9)), and sized values: both are checked first.
    for name, function in list(env.filters.items()):
        env.filters[name] = _sized(function, name)
    for name, function in list(env.tests.items()):  # "x is in s" scans s
        env.tests[name] = _sized(function, "")
    return env


def _filter_estimate(name: str, value, args: tuple, kwargs: dict):
    """Before a filter that may make much more than it takes: its result's size. Returns the
    value to filter (an iterable to join, read once into a list)."""

    def arg(i: int, key: str, default):
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "join":
        value = list(_bounded(value))
        _join_estimate(str(arg(0, "d", "")), value)
    elif name == "replace" and len(args) >= 2:
        _replace_estimate(value, args[0], args[1], arg(2, "count", -1))
    elif name == "format" and isinstance(value, str):
        _format_estimate(value, [*args, *kwargs.values()])
    elif name == "indent" and isinstance(value, str):
        width = arg(0, "width", 4)
        width = len(width) if isinstance(width, str) else width
        if isinstance(width, int):
            _would_make(len(value) + (value.count("\n") + 1) * max(width, 0), "indent")
    elif name == "wordwrap" and isinstance(value, str):
        width, wrap = arg(0, "width", 79), arg(3, "wrapstring", None)
        if isinstance(width, int) and width > 0:
            lines = len(value) // width + value.count("\n") + 1
            wrap = wrap if isinstance(wrap, str) else "\n"
            _would_make(len(value) + lines * len(wrap), "wordwrap")
    elif name == "tojson" and isinstance(arg(0, "indent", None), int):
        if arg(0, "indent", None) > 64:
            raise _over("spaces of indent in tojson", 64)
        _would_make(_size(value) * 65, "tojson")
    elif name == "sum" and not isinstance(arg(1, "start", 0), int | float):
        raise ChatTemplateError("the chat template's sum filter adds numbers only")
    return value


def _sized(function, name: str):
    import functools

    # A filter marked to take Jinja's context (or environment) takes it first, then the value.
    skip = 2 if hasattr(function, "jinja_pass_arg") else 1

    @functools.wraps(function)  # keeps the mark
    def wrapper(*args, **kwargs):
        _step()
        value, rest = args[skip - 1], args[skip:]
        _taken(value, *rest, *kwargs.values())
        for size in (*rest, *kwargs.values()):
            _check_size(size)
        value = _filter_estimate(name, value, rest, kwargs)
        return _made(function(*args[: skip - 1], value, *rest, **kwargs))

    return wrapper


def _containers(variables: dict) -> frozenset[int]:
    """The ids of the lists and dicts given to a rendering (the conversation, its messages)."""
    found: set[int] = set()
    stack = list(variables.values())
    while stack:
        value = stack.pop()
        if isinstance(value, list | tuple | dict) and id(value) not in found:
            found.add(id(value))
            stack.extend(value.values() if isinstance(value, dict) else value)
    return frozenset(found)


def render_bounded(template, **variables) -> str:
    """``template`` (compiled by ``bounded_environment``) rendered within the bounds."""
    token = _budget.set([0, 0, 0, _containers(variables)])
    try:
        out, size = [], 0
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > TEMPLATE_MAX_OUTPUT:
                raise _over("characters of output", TEMPLATE_MAX_OUTPUT)
            out.append(chunk)
        return "".join(out)
    except RecursionError:
        raise ChatTemplateTooCostly("the chat template was stopped: it recursed too deep") from None
    except MemoryError:
        raise ChatTemplateTooCostly("the chat template was stopped: it ran out of memory") from None
    finally:
        _budget.reset(token)


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


def compile_template(source: str):
    """A chat template compiled in the bounded sandbox, with the helpers templates call."""

    def raise_exception(message):
        raise ChatTemplateError(f"the chat template refused: {message}")

    env = bounded_environment()
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


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
    # Chat templates end a turn with their own token, which the model learns to emit.
    for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        found = tok.tokenizer.token_to_id(token)
        if found is not None and token in tok.template:
            ids.add(found)
    return ids


def build_char_tokenizer(texts, directory: Path) -> ChatTokenizer:
    """The preset's tokenizer: one token per character of ``texts``, the special tokens and
    the ChatML template, written as a fast tokenizer that PaddleNLP and transformers load."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = sorted({c for text in texts for c in text} | set("\n"))
    vocab = {token: i for i, token in enumerate(PRESET_SPECIALS)}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    unknown = "<unk>"
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(PRESET_SPECIALS))
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "LlamaTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "padding_side": "left",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 512,
        # PaddleNLP reads the template here or from chat_template.json; transformers from
        # either and from chat_template.jinja.
        "chat_template": CHATML,
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


def rouge_l(candidate: str, reference: str) -> float:
    """Character-level ROUGE-L F1: Chinese has no spaces to split words on."""
    a = [c for c in candidate if not c.isspace()]
    b = [c for c in reference if not c.isspace()]
    if not a or not b:
        return 0.0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)
