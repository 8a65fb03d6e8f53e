"""JSON from a client, parsed strictly: every shape that the standard parser accepts but the
service cannot store, compare or send is refused, naming where it is.

Refused, each with a 400: text that is not UTF-8; malformed JSON; ``NaN``, ``Infinity`` and
numbers that overflow to them (``1e400``); integers outside the 64-bit signed range (also what
keeps Python's 4,300-digit conversion limit out of reach); an object with the same key twice;
strings holding NUL or a lone UTF-16 surrogate (``"\\ud800"``), which neither UTF-8 nor
PostgreSQL can carry; nesting deeper than :data:`MAX_DEPTH`; and more than :data:`MAX_VALUES`
items and fields in all, which is counted before the text is parsed (a body of 16 MiB could
otherwise hold eight million numbers, and cost seconds of CPU to parse and walk).
"""

from __future__ import annotations

import json
import math
import re
from functools import partial
from typing import Any

from ..errors import ValidationFailed
from .validation import field_path

#: Deepest nesting of arrays and objects accepted in a request body.
MAX_DEPTH = 32
#: Items of arrays and fields of objects in one body, at most, all levels together.
MAX_VALUES = 100_000
_INT_DIGITS = 19
_INT_RANGE = range(-(2**63), 2**63)
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
#: Parsed values that need no look: what the parser makes of numbers that fit, true, false, null.
_SETTLED = frozenset({int, float, bool, type(None)})
#: A run of digits as long as the longest 64-bit integer's (found as nines, where every digit
#: was made one: a pass of C over the text, where a regular expression takes ten times as long).
_LONG_DIGITS = "9" * 19
_DIGITS_AS_NINES = str.maketrans("012345678", "999999999")
#: A text longer than this is not searched for what its values can tell more cheaply: its
#: integers all go through the hook, and its arrays and objects are walked. Such a text is long
#: for its strings (an html part, files in base64), and each search is a pass over all of it
#: while the worker's other threads wait (the digits' alone 44 ms of a 12 MB body on a slow
#: day); the hook is called once an integer and the walk visits the arrays and objects only,
#: both bounded by :data:`MAX_VALUES`.
_SEARCHED_CHARS = 65_536


class _Duplicated(dict[str, Any]):
    """An object that had a key twice (the parser keeps the last)."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


class _Unfit:
    """A number that does not fit, kept as it was written."""

    def __init__(self, text: str) -> None:
        self.text = text


def parse(raw: bytes) -> Any:
    """The JSON document in ``raw``.

    :raises ValidationFailed: with a message naming the field and the rule.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationFailed("body: not valid UTF-8") from None
    _count_values(text)
    faults: list[Any] = []  # what the hooks made that the walk must find
    long = len(text) > _SEARCHED_CHARS
    try:
        document = json.loads(
            text,
            object_pairs_hook=partial(_object, faults),
            # Without a run of 19 digits anywhere, every integer fits in 64 bits: the parser's
            # own conversion, in C, is enough (most bodies).
            parse_int=partial(_integer, faults)
            if long or _LONG_DIGITS in text.translate(_DIGITS_AS_NINES)
            else None,
            parse_float=partial(_float, faults),
            parse_constant=_constant,
        )
    except json.JSONDecodeError as exc:
        raise ValidationFailed(
            f"body: malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise ValidationFailed(f"body: nested deeper than {MAX_DEPTH} levels") from None
    # NUL and lone surrogates reach a string only through a \u escape: the parser refuses raw
    # control characters, and UTF-8 cannot carry a surrogate. Without one, no string is
    # searched (most bodies: an html part of kilobytes is searched for nothing). And the walk
    # is needed at all only for that, for what the hooks found, or for a body with more
    # arrays and objects than it may be deep (most bodies have a handful).
    escaped = "\\u" in text
    if escaped or faults or long or text.count("[") + text.count("{") > MAX_DEPTH:
        _inspect(document, escaped)
    return document


def _count_values(text: str) -> None:
    """Refuse, before parsing, a text with more than :data:`MAX_VALUES` items and fields: each
    but the first of an array or object follows a comma outside any string, so there are more
    when there are that many such commas. Every step is one
    pass of C over the text; the strings are cut out only when there are few of them.

    :raises ValidationFailed: there are more.
    """
    too_many = ValidationFailed(f"body: more than {MAX_VALUES} items and fields in all")
    if text.count(",") < MAX_VALUES:
        return
    # A field has two strings at most (its key, its value), an item one.
    if (text.count('"') - text.count('\\"')) // 2 > 2 * MAX_VALUES:
        raise too_many
    plain = text.replace("\\\\", "").replace('\\"', "")
    if "".join(plain.split('"')[::2]).count(",") >= MAX_VALUES:
        raise too_many


def _object(faults: list[Any], pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
    faults.append(duplicate)
    return _Duplicated(pairs, duplicate)


def _integer(faults: list[Any], text: str) -> int | _Unfit:
    if len(text) < _INT_DIGITS:  # fits whatever its digits
        return int(text)
    if len(text.lstrip("-")) <= _INT_DIGITS and int(text) in _INT_RANGE:
        return int(text)
    faults.append(text)
    return _Unfit(text)


def _float(faults: list[Any], text: str) -> float | _Unfit:
    number = float(text)
    if math.isfinite(number):
        return number
    faults.append(text)
    return _Unfit(text)


def _constant(name: str) -> None:
    raise ValidationFailed(f"body: {name} is not valid JSON")


def _inspect(document: Any, escaped: bool) -> None:
    """Walk the document once, without recursion, and refuse the first thing that is wrong.

    :param escaped: the text had a ``\\u`` escape, so a string may hold NUL or a surrogate.
    """
    # Values with nothing to look at are not visited one by one (a list of numbers).
    settled = _SETTLED if escaped else _SETTLED | {str}
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if escaped and _BAD_TEXT.search(value):
                raise ValidationFailed(f"{_field(path)}: {_what_is_bad(value)}")
        elif isinstance(value, dict):
            _deep(path)
            if isinstance(value, _Duplicated):
                raise ValidationFailed(f'{_field(path)}: the key "{value.key}" is given twice')
            if escaped:
                for key in value:
                    if _BAD_TEXT.search(key):
                        raise ValidationFailed(f"{_field(path)}: a key {_what_is_bad(key)}")
            if not settled.issuperset(map(type, value.values())):  # (a pass of C)
                stack.extend(
                    (item, (*path, key)) for key, item in value.items() if type(item) not in settled
                )
        elif isinstance(value, list):
            _deep(path)
            if not settled.issuperset(map(type, value)):
                stack.extend(
                    (item, (*path, index))
                    for index, item in enumerate(value)
                    if type(item) not in settled
                )
        elif isinstance(value, _Unfit):
            raise ValidationFailed(
                f"{_field(path)}: the number {value.text[:40]} is out of range "
                f"(integers from -2^63 to 2^63-1, finite numbers)"
            )


def _deep(path: tuple[str | int, ...]) -> None:
    if len(path) >= MAX_DEPTH:
        raise ValidationFailed(f"{_field(path[:MAX_DEPTH])}: nested deeper than {MAX_DEPTH} levels")


def _what_is_bad(text: str) -> str:
    if "\x00" in text:
        return "must not contain NUL (\\u0000)"
    return "contains a lone UTF-16 surrogate, which is not a character"


def _field(path: tuple[str | int, ...]) -> str:
    return field_path(path) or "body"
