"""Cursor paging, newest first: a page ends at a sequence number; the next starts below it.

Sequence numbers grow with every insert, so mail that arrives while a client pages through
lands above the first page and never shifts, repeats or skips what follows.

Sequence numbers are shared by all accounts, so a cursor must not show one: it would tell an
account how much everybody else sends. A cursor is the number sealed with AES-GCM under a key
the store keeps for the whole service, with the account and the list it belongs to as
associated data. It reads as noise; one forged, altered, or given by another account or for
another list does not open, and is a 400.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import ValidationFailed
from ..store.keyring import Keyring

Item = TypeVar("Item")

DEFAULT_LIMIT = 20
_NONCE = 12
_SECRET_NAME = "cursors"


class Cursors:
    """Seals and opens the cursors of one service, under a key of the :class:`Keyring`."""

    def __init__(self, keyring: Keyring) -> None:
        self._keyring = keyring
        self._aead: AESGCM | None = None

    def seal(self, seq: int, account_id: str, listing: str) -> str:
        nonce = os.urandom(_NONCE)
        sealed = self._cipher().encrypt(nonce, seq.to_bytes(8, "big"), _bound(account_id, listing))
        return base64.urlsafe_b64encode(nonce + sealed).decode("ascii").rstrip("=")

    def open(self, cursor: str | None, account_id: str, listing: str) -> int | None:
        """The sequence number of a cursor this service gave this account for this list.

        :raises ValidationFailed: any other string.
        """
        if cursor is None:
            return None
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            number = self._cipher().decrypt(raw[:_NONCE], raw[_NONCE:], _bound(account_id, listing))
            return int.from_bytes(number, "big")
        except (binascii.Error, ValueError, InvalidTag):
            raise ValidationFailed(
                "cursor: not a cursor this service gave out for this list (use nextCursor)"
            ) from None

    def _cipher(self) -> AESGCM:
        if self._aead is None:
            self._aead = AESGCM(self._keyring.key(_SECRET_NAME))
        return self._aead


def _bound(account_id: str, listing: str) -> bytes:
    return f"{listing}\x00{account_id}".encode()


def page(
    rows: Sequence[Item],
    limit: int,
    cursor_of: Callable[[Item], str],
    present: Callable[[Sequence[Item]], list[dict[str, Any]]],
) -> dict[str, Any]:
    """The page object ``{"data", "hasMore", "nextCursor"}`` of ``rows``, fetched with one extra
    row beyond ``limit`` to know whether more follow."""
    shown = rows[:limit]
    more = len(rows) > limit
    return {
        "data": present(shown),
        "hasMore": more,
        "nextCursor": cursor_of(shown[-1]) if more and shown else None,
    }


def list_page(
    query: dict[str, Any],
    cursors: Cursors,
    account_id: str,
    listing: str,
    fetch: Callable[[int | None, int], Sequence[Item]],
    seq_of: Callable[[Item], int],
    present: Callable[[Sequence[Item]], list[dict[str, Any]]],
) -> dict[str, Any]:
    """A page of one account's list for the ``limit`` and ``cursor`` of a schema-valid query.

    :param fetch: ``fetch(before_seq, count)`` returns up to ``count`` items, newest first.
    """
    limit = int(query.get("limit", DEFAULT_LIMIT))
    before = cursors.open(query.get("cursor"), account_id, listing)
    return page(
        fetch(before, limit + 1),
        limit,
        lambda item: cursors.seal(seq_of(item), account_id, listing),
        present,
    )
