"""A Jinja2 sandbox whose renders are bounded: in CPU time, in the text they may create, and in
what they may print.

Jinja's :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment` keeps a template away from
Python's internals and from mutating its variables; it does not bound what a render costs. Here
every step that can repeat or grow is counted against the :class:`Budget` of the render running
in this thread:

* every iteration of a ``for`` loop (the compiled tree wraps each loop's iterable), of
  ``range()`` and of a recursive ``loop()``, every call (macros, methods, ``loop()``), every
  filter, test, attribute or item lookup and every arithmetic operator checks the CPU
  deadline, so even a loop that prints nothing stops in time, and a filter that sorts or
  selects by an attribute stops within its input;
* every operation that makes text or lists (printing, ``~``, ``+``, ``*``, ``%``, slicing,
  filters, calls) is charged what it makes, and refused *before* it runs when its size can be
  known in advance (``'x' * n``, ``center(n)``, ``replace``, ``9 ** n``): no single step can
  allocate more than the render has left;
* nothing is evaluated at compile time (the optimizer is off, output is finalized at run time
  and every operator is intercepted), so a template's constants cost nothing until it renders
  under a budget;
* only plain data (text, numbers, booleans, None, and lists and mappings of them) can be
  printed or turned into text, so no Python object's ``repr`` (with its memory address) leaks;
* no single step can run long between two checks of the deadline, because what it works on is
  bounded: a list or mapping a template builds (or gets in its variables) has at most
  :data:`MAX_ITEMS` items and a text at most the output limit; a filter that sorts, groups or
  goes through its input item by item takes at most :data:`MAX_ITEMS` items (a text counts its
  characters), and one that works through a text in Python at most :data:`TEXT_INPUT` of its
  characters. So the CPU deadline holds inside a filter too, to within one such step (a few
  milliseconds), and is checked again as the filter returns.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

from jinja2 import StrictUndefined, nodes, pass_context, pass_eval_context
from jinja2.filters import FILTERS
from jinja2.nodes import EvalContext
from jinja2.runtime import Context, LoopContext, markup_join, str_join
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment
from jinja2.utils import Cycler, Joiner, Namespace
from jinja2.visitor import NodeTransformer

from ..limits.render_budget import MAX_ITEMS, Budget, RenderLimit, budget

#: The largest integer a template may make, in bits (about 1,200 decimal digits).
MAX_INT_BITS = 4096
#: Characters that the filters which work through a text in Python may take, each about 5 ms
#: of CPU at most (measured at a million characters: urlize 524 ms, wordwrap 171 ms, title
#: 95 ms, urlencode 54 ms, striptags 43 ms, wordcount 38 ms).
TEXT_INPUT = {
    "urlize": 10_000,
    "wordwrap": 25_000,
    "title": 50_000,
    "urlencode": 100_000,
    "striptags": 100_000,
    "wordcount": 100_000,
}
#: The filters that sort, group or go through their input item by item.
_BY_ITEM = frozenset(
    "batch dictsort groupby join list map max min reject rejectattr select selectattr slice "
    "sort sum unique xmlattr".split()
)
#: A reference in a list or mapping, as charged against the budget.
_REFERENCE = 8
_PRINTF = re.compile(r"%[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_STR_METHODS = frozenset(
    "upper lower title capitalize casefold swapcase strip lstrip rstrip startswith endswith "
    "split rsplit splitlines partition rpartition find rfind index rindex count isdigit "
    "isalpha isalnum isspace islower isupper istitle isdecimal isnumeric removeprefix "
    "removesuffix".split()
)
_CONTAINER_METHODS = frozenset("items keys values get index count".split())
_ALLOWED_FILTERS = frozenset(
    "abs attr batch capitalize center count d default dictsort e escape filesizeformat first "
    "float forceescape format groupby indent int items join last length list lower map max min "
    "reject rejectattr replace reverse round safe select selectattr slice sort string "
    "striptags sum title tojson trim truncate unique upper urlencode urlize wordcount wordwrap "
    "xmlattr".split()
)


# -- what the compiled tree calls -----------------------------------------------------------


def guarded_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    """A ``for`` loop's iterable, each step checked against the CPU deadline."""
    current = budget()
    for item in iterable:
        current.tick()
        yield item


@pass_eval_context
def concat(eval_ctx: EvalContext, *parts: Any) -> str:
    """``a ~ b``: charged before it is joined."""
    current = budget()
    current.tick()
    texts = [printable(part) for part in parts]
    size = sum(len(str(text)) for text in texts)
    current.afford(size)
    current.charge(size)
    return markup_join(texts) if eval_ctx.autoescape else str_join(texts)


def slice_of(value: Any, start: Any, stop: Any, step: Any) -> Any:
    """``value[start:stop:step]``: charged for what it copies."""
    current = budget()
    current.tick()
    result = value[start:stop:step]
    _charge(current, result)
    return result


class _Range:
    """``range()`` as templates get it: at most ``MAX_RANGE`` items, each step checked."""

    def __init__(self, *args: int) -> None:
        self._range = range(*args)
        if len(self._range) > MAX_RANGE:
            raise RenderLimit(f"range(): at most {MAX_RANGE} items")

    def __iter__(self) -> Iterator[int]:
        return guarded_iter(self._range)

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: Any) -> Any:
        return self._range[index]

    def __contains__(self, value: object) -> bool:
        return value in self._range

    def __reversed__(self) -> Iterator[int]:
        return guarded_iter(reversed(self._range))


# -- printing ---------------------------------------------------------------------------------


def printable(value: Any) -> Any:
    """``value`` if it is plain data that may become text; refused otherwise (a function, a
    method, a macro or another Python object would print its type and memory address)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None or isinstance(item, str | int | float | bool):
            continue
        if isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            raise RenderLimit(
                "the template prints something that is not text, a number or a list of them"
            )
    return value


@pass_context
def _finalize(context: Context, value: Any) -> Any:
    current = budget()
    current.tick()
    printable(value)
    text = value if isinstance(value, str) else str(value)
    current.charge(len(text))
    return text


def _size(value: Any) -> int:
    """What a new value costs the budget: its characters, or its references and the
    characters of the text it holds directly.

    :raises RenderLimit: it is a list or mapping of more than :data:`MAX_ITEMS` items.
    """
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple | dict) and len(value) > MAX_ITEMS:
        raise RenderLimit(f"the template made a list or mapping of more than {MAX_ITEMS} items")
    if isinstance(value, list | tuple):
        return _REFERENCE * len(value) + sum(len(item) for item in value if isinstance(item, str))
    if isinstance(value, dict):
        return 2 * _REFERENCE * len(value)
    return 0


def _charge(current: Budget, value: Any) -> None:
    """Charge a value just made, refusing a text longer than the render may make in one."""
    if isinstance(value, str) and len(value) > current.max_text:
        raise RenderLimit(f"the template made a text of more than {current.max_text} characters")
    current.charge(_size(value))


def _int_bits(value: Any) -> int:
    return abs(value).bit_length() if isinstance(value, int) else 0


def _check_printf(template: str, current: Budget) -> None:
    """A ``%`` format with ``*`` or a width or precision that could make more text than the
    render has left is refused before it runs."""
    for match in _PRINTF.finditer(template):
        for part in match.groups():
            if part == "*" or (part is not None and int(part) > current.chars_left):
                raise RenderLimit("a % format's width or precision is too large")


# -- operators ---------------------------------------------------------------------------------


def _multiply(left: Any, right: Any, current: Budget) -> Any:
    sequence, count = (left, right) if isinstance(right, int) else (right, left)
    if isinstance(sequence, str | list | tuple) and isinstance(count, int):
        if isinstance(sequence, list | tuple) and len(sequence) * count > MAX_ITEMS:
            raise RenderLimit(f"the template made a list of more than {MAX_ITEMS} items")
        current.afford(_size(sequence) * max(count, 0))
    elif _int_bits(left) + _int_bits(right) > MAX_INT_BITS:
        raise RenderLimit(f"a number larger than {MAX_INT_BITS} bits")
    return left * right


def _power(left: Any, right: Any, current: Budget) -> Any:
    if isinstance(left, int) and isinstance(right, int) and right > 0:
        if max(_int_bits(left), 1) * right > MAX_INT_BITS and abs(left) > 1:
            raise RenderLimit(f"a number larger than {MAX_INT_BITS} bits")
    return left**right


def _modulo(left: Any, right: Any, current: Budget) -> Any:
    if isinstance(left, str):
        _check_printf(left, current)
        printable(right)
    return left % right


_OPERATORS: dict[str, Callable[[Any, Any, Budget], Any]] = {
    "*": _multiply,
    "**": _power,
    "%": _modulo,
    "+": lambda left, right, current: left + right,
    "-": lambda left, right, current: left - right,
    "/": lambda left, right, current: left / right,
    "//": lambda left, right, current: left // right,
}


# -- filters -----------------------------------------------------------------------------------


def _filter_sizes(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any], current: Budget
) -> None:
    """Refuse, before it runs, a filter call whose result could outgrow the budget."""
    value = args[0] if args else None
    rest = list(args[1:])

    def argument(position: int, keyword: str, default: Any) -> Any:
        return rest[position] if len(rest) > position else kwargs.get(keyword, default)

    text = len(value) if isinstance(value, str) else 0
    if name in TEXT_INPUT and text > TEXT_INPUT[name]:
        raise RenderLimit(f"{name}(): at most {TEXT_INPUT[name]} characters")
    if name in _BY_ITEM and isinstance(value, Sized) and len(value) > MAX_ITEMS:
        raise RenderLimit(f"{name}(): at most {MAX_ITEMS} items (a text counts its characters)")
    if name == "center":
        current.afford(max(text, _whole(argument(0, "width", 80))))
    elif name == "indent":
        width = argument(0, "width", 4)
        width = len(width) if isinstance(width, str) else _whole(width)
        current.afford(text + (text + 1) * width)
    elif name == "wordwrap":
        wrap = argument(3, "wrapstring", None) or "\n"
        width = max(_whole(argument(0, "width", 79)), 1)
        current.afford(text + (text // width + 1) * len(str(printable(wrap))))
    elif name == "replace":
        old, new = str(printable(argument(0, "old", ""))), str(printable(argument(1, "new", "")))
        current.afford(
            text + (text + 1) * len(new) if not old else text // len(old) * len(new) + text
        )
    elif name == "join":
        items = list(value) if isinstance(value, Iterable) else []
        printable(items)
        glue = str(printable(argument(0, "d", "")))
        current.afford(sum(len(str(item)) for item in items) + len(glue) * len(items))
    elif name == "format":
        _check_printf(str(printable(value)), current)
        printable(rest)
        printable(kwargs)
    elif name in ("batch", "slice"):
        size = _whole(argument(0, "linecount" if name == "batch" else "slices", 1))
        length = len(value) if isinstance(value, Sized) else 0
        if size > max(length, 1):
            raise RenderLimit(f"{name}(): at most as many as the items it is given")
    elif name == "sum" and not isinstance(argument(1, "start", 0), int | float):
        raise RenderLimit("sum(): start must be a number")
    elif name == "tojson" and _whole(argument(0, "indent", 0) or 0) > 16:
        raise RenderLimit("tojson(): indent at most 16")
    elif name in ("string", "e", "escape", "forceescape", "safe", "urlencode", "pprint"):
        printable(value)


def _whole(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    # Jinja passes the context, eval context or environment first to a filter marked so.
    passed = 1 if hasattr(function, "jinja_pass_arg") else 0

    def bounded(*args: Any, **kwargs: Any) -> Any:
        current = budget()
        current.tick()
        if (
            name == "join"
            and len(args) > passed
            and not isinstance(args[passed], str | list | tuple)
        ):
            args = (*args[:passed], list(args[passed]), *args[passed + 1 :])  # counted once
        _filter_sizes(name, args[passed:], kwargs, current)
        result = function(*args, **kwargs)
        _charge(current, result)
        current.tick()  # a filter that took long stops the render as it returns
        return result

    if passed:
        bounded.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
    return bounded


# -- the environment ------------------------------------------------------------------------


class _Guards(NodeTransformer):
    """Rewrites a parsed template so that loops, ``~`` and slices go through the budget."""

    def _call(self, name: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
        target = nodes.ImportedName(f"{__name__}.{name}", lineno=lineno)
        return nodes.Call(target, args, [], None, None, lineno=lineno)

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = self._call("guarded_iter", [node.iter], node.lineno)  # type: ignore[list-item]
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        return self._call("concat", list(node.nodes), node.lineno)

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Expr:
        self.generic_visit(node)
        if not isinstance(node.arg, nodes.Slice):
            return node
        bound = node.arg
        parts: list[nodes.Expr] = [
            part if part is not None else nodes.Const(None, lineno=node.lineno)
            for part in (bound.start, bound.stop, bound.step)
        ]
        return self._call("slice_of", [node.node, *parts], node.lineno)


def guard(tree: nodes.Template, environment: BoundedEnvironment) -> nodes.Template:
    """The parsed ``tree`` with its loops, ``~`` and slices bounded."""
    guarded: nodes.Template = _Guards().visit(tree)
    guarded.set_environment(environment)
    return guarded


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox every template renders in; see the module's description."""

    intercepted_binops = frozenset(_OPERATORS)
    intercepted_unops = frozenset(["+", "-"])

    def __init__(self, autoescape: bool) -> None:
        super().__init__(
            autoescape=autoescape,
            undefined=StrictUndefined,
            optimized=False,
            finalize=_finalize,
        )
        self.globals = {
            "range": _Range,
            "dict": dict,
            "namespace": Namespace,
            "cycler": Cycler,
            "joiner": Joiner,
        }
        self.filters = {
            name: _bounded_filter(name, function)
            for name, function in FILTERS.items()
            if name in _ALLOWED_FILTERS
        }

    def call_binop(self, context: Context, operator_name: str, left: Any, right: Any) -> Any:
        current = budget()
        current.tick()
        result = _OPERATORS[operator_name](left, right, current)
        _charge(current, result)
        return result

    def getitem(self, obj: Any, argument: Any) -> Any:
        # Filters that sort or group by an attribute look it up for each item in Python: the
        # deadline is checked there too.
        budget().tick()
        return super().getitem(obj, argument)

    def getattr(self, obj: Any, attribute: str) -> Any:
        budget().tick()
        return super().getattr(obj, attribute)

    def call_test(self, name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        budget().tick()  # select and reject call a test for each item
        return super().call_test(name, value, *args, **kwargs)

    def call_unop(self, context: Context, operator_name: str, arg: Any) -> Any:
        budget().tick()
        return operator.neg(arg) if operator_name == "-" else operator.pos(arg)

    def wrap_str_format(self, value: Any) -> None:
        """``str.format`` is not offered (its widths allocate before anything can count them):
        it is refused like any other attribute not allowed; the ``format`` filter, which is
        bounded, does the same job."""
        return None

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, str):
            return attr in _STR_METHODS
        if isinstance(obj, dict | list | tuple):
            return attr in _CONTAINER_METHODS
        return super().is_safe_attribute(obj, attr, value)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        current = budget()
        current.tick()
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (guarded_iter(args[0]), *args[1:])
        result = super().call(__context, __obj, *args, **kwargs)
        _charge(current, result)
        return result
