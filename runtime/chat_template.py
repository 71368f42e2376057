"""A model's chat template (Jinja, an uploaded file) compiled in Jinja's immutable sandbox and
rendered within bounds of work, value sizes and output, so that no template keeps a process
busy or fills its memory; ``ChatTemplateError`` is what a template that cannot be used raises.

Reading a model's template from its files, and rendering conversations with it, is
``runtime.chat``'s.
"""

import re
from contextvars import ContextVar
from typing import Any


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


def compile_template(source: str):
    """A chat template compiled in the bounded sandbox, with the helpers templates call."""

    def raise_exception(message):
        raise ChatTemplateError(f"the chat template refused: {message}")

    env = bounded_environment()
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


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
