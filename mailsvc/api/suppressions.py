"""The suppression endpoints: the addresses an account no longer sends to.

An address joins the list by itself on a hard bounce (a ``5.1.x`` refusal at RCPT, or a bounce
report) and on a complaint; the account may add one (``manual``, or a reason it brings from
elsewhere) and remove one. Mail to a suppressed address is accepted, but that recipient is never
sent to and never charged.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ..errors import AlreadyExists, NotFound
from ..http.auth import Principal
from ..http.paging import list_page
from ..http.validation import Problems
from ..mail.addresses import parse_address
from ..settings import Settings
from ..store import Reads, Suppression, Writes
from ..timestamps import iso_time
from .change import Change
from .dependencies import Dependencies


def parse_new_suppression(
    body: dict[str, Any], settings: Settings, problems: Problems
) -> dict[str, Any]:
    """:raises ValidationFailed: the address does not parse (and every other problem)."""
    address = None
    if "address" in body and not problems.failed("address"):
        with problems.checking("address"):
            address = parse_address(body["address"].strip(), "address")
    problems.raise_if_any()
    return {"address": address, "reason": body.get("reason", "manual")}


def create_suppression(
    reads: Reads, principal: Principal, deps: Dependencies, *, body: dict[str, Any]
) -> Change:
    account_id, address, now = principal.account_id, body["address"], deps.clock()
    shown = Suppression(account_id, address.lower(), body["reason"], None, None, now)

    def add(tx: Writes) -> None:
        if not tx.add_suppression(account_id, address, shown.reason, None, None, now):
            existing = tx.get_suppression(account_id, address)
            reason = existing.reason if existing else "?"
            raise AlreadyExists(f"address: {address} is already suppressed ({reason})")

    return Change(add, present_suppression(shown))


def list_suppressions(
    view: Reads, principal: Principal, deps: Dependencies, *, query: dict[str, Any]
) -> dict[str, Any]:
    def present_all(found: Sequence[Suppression]) -> list[dict[str, Any]]:
        return [present_suppression(suppression) for suppression in found]

    fetch = partial(view.list_suppressions, principal.account_id, query.get("reason"))
    return list_page(
        query,
        deps.cursors,
        principal.account_id,
        "suppressions",
        fetch,
        lambda suppression: suppression.seq,
        present_all,
    )


def delete_suppression(
    reads: Reads, principal: Principal, deps: Dependencies, *, address: str
) -> Change:
    """Send to the address again."""
    key = parse_address(address, "address")

    def delete(tx: Writes) -> None:
        if not tx.delete_suppression(principal.account_id, key):
            raise NotFound(f"address: {key} is not suppressed")

    return Change(delete, {"address": key.lower(), "deleted": True})


def present_suppression(suppression: Suppression) -> dict[str, Any]:
    return {
        "address": suppression.address,
        "reason": suppression.reason,
        "emailId": suppression.email_id,
        "detail": suppression.detail,
        "createdAt": iso_time(suppression.created_at),
    }
