"""Cursor paging, newest first: a page ends at a sequence number; the next starts below it.

Sequence numbers grow with every insert, so mail that arrives while a client pages through
lands above the first page and never shifts, repeats or skips what follows.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .errors import ValidationFailed

Item = TypeVar("Item")

DEFAULT_LIMIT = 20


def decode_cursor(cursor: str | None) -> int | None:
    """The sequence number a cursor stands for.

    :raises ValidationFailed: it is not a cursor this service gave out.
    """
    if cursor is None:
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        kind, _, number = text.partition(":")
        if kind == "seq" and number.isdigit():
            return int(number)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise ValidationFailed("cursor: not a cursor this service gave out (use nextCursor)")


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"seq:{seq}".encode("ascii")).decode("ascii").rstrip("=")


def page(
    rows: Sequence[Item],
    limit: int,
    seq_of: Callable[[Item], int],
    present: Callable[[Sequence[Item]], list[dict[str, Any]]],
) -> dict[str, Any]:
    """The page object ``{"data", "hasMore", "nextCursor"}`` of ``rows``, fetched with one extra
    row beyond ``limit`` to know whether more follow."""
    shown = rows[:limit]
    more = len(rows) > limit
    return {
        "data": present(shown),
        "hasMore": more,
        "nextCursor": encode_cursor(seq_of(shown[-1])) if more and shown else None,
    }


def list_page(
    query: dict[str, Any],
    fetch: Callable[[int | None, int], Sequence[Item]],
    seq_of: Callable[[Item], int],
    present: Callable[[Sequence[Item]], list[dict[str, Any]]],
) -> dict[str, Any]:
    """A page for the ``limit`` and ``cursor`` of a schema-valid query.

    :param fetch: ``fetch(before_seq, count)`` returns up to ``count`` items, newest first.
    """
    limit = int(query.get("limit", DEFAULT_LIMIT))
    return page(fetch(decode_cursor(query.get("cursor")), limit + 1), limit, seq_of, present)
