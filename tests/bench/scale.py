"""The store as it grows: a million emails already sent, and a queue of a hundred thousand.

``fill`` puts emails in a store through the store's own batch insert (the rows, recipients
and tags an accepted email has), then marks them sent unless they are to stay due.
``claim_cost`` times the claim of the delivery threads' next emails, in-process, rolled back
each time so the queue stays as it was.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from dataclasses import dataclass

from mailsvc.ids import new_ordered_id
from mailsvc.store import NewEmail, NewRecipient, Writes, open_store

#: Addresses the filled emails go to, one after the other: each gets count / ADDRESSES emails.
ADDRESSES = 100_000
#: Values of the ``plan`` tag, one after the other (``category`` takes one of three).
PLANS = 1_000
CATEGORIES = ("receipt", "reset", "alert")
_CHUNK = 2_000


@dataclass(frozen=True)
class Filled:
    seconds: float
    count: int
    #: The id of an email from the middle of the fill, for GET /v1/emails/{id}.
    middle_id: str


def fill(database: str, account_id: str, domain: str, count: int, due: bool = False) -> Filled:
    """``count`` small emails of ``account_id`` (one recipient and two tags each, created over
    the last 30 days); sent and off the queue unless ``due``."""
    store = open_store(database)
    started, now = time.monotonic(), time.time()
    middle_id = ""
    try:
        for first in range(0, count, _CHUNK):
            batch = [
                _email(account_id, domain, number, now - 30 * 86400 * (1 - number / count))
                for number in range(first, min(count, first + _CHUNK))
            ]
            if first <= count // 2 < first + _CHUNK:
                middle_id = batch[count // 2 - first].id
            store.write(_insert(batch), durable=False)
    finally:
        store.shutdown()
    if not due:
        _mark_sent(database, account_id)
    return Filled(time.monotonic() - started, count, middle_id)


def _email(account_id: str, domain: str, number: int, created_at: float) -> NewEmail:
    email_id = new_ordered_id("em", created_at)  # as the service makes them
    return NewEmail(
        id=email_id,
        account_id=account_id,
        sender_name=None,
        sender_address=f"receipts@{domain}",
        recipients=(NewRecipient(f"user{number % ADDRESSES}@example.org"),),
        subject=f"Receipt {number}",
        html=None,
        text="Your receipt.",
        message_id=f"<{email_id}@{domain}>",
        created_at=created_at,
        tags=(
            ("category", CATEGORIES[number % len(CATEGORIES)]),
            ("plan", f"p{number % PLANS}"),
        ),
    )


def _insert(batch: list[NewEmail]):
    def job(tx: Writes) -> None:
        assert all(seq is not None for seq in tx.enqueue_emails(batch)), "domain not verified"

    return job


def _mark_sent(database: str, account_id: str) -> None:
    """Every queued email of the account sent, as delivery would leave it (raw SQL: the store
    has no verb that finishes an email nobody claimed)."""
    statements = [
        "UPDATE emails SET status = 'sent', due_at = NULL, sent_at = created_at, attempts = 1 "
        "WHERE account_id = {0} AND due_at IS NOT NULL",
        "UPDATE recipients SET status = 'sent', smtp_code = 250 "
        "WHERE account_id = {0} AND status = 'queued'",
        # The account's daily counters, as each delivery adds to them.
        "INSERT INTO daily_outcomes (account_id, day, outcome, shard, count) "
        "SELECT account_id, {1}, 'sent', seq % 8, count(*) FROM emails "
        "WHERE account_id = {0} AND status = 'sent' GROUP BY 1, 2, 3, 4 "
        "ON CONFLICT (account_id, day, outcome, shard) "
        "DO UPDATE SET count = daily_outcomes.count + excluded.count",
    ]
    if database.startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(database) as connection:
            for statement in statements:
                day = "floor(sent_at / 86400)::integer"
                connection.execute(statement.format("%s", day), (account_id,))
        return
    connection = sqlite3.connect(database)
    with connection:
        for statement in statements:
            connection.execute(
                statement.format("?", "CAST(sent_at / 86400 AS INTEGER)"), (account_id,)
            )
    connection.close()


class _RolledBack(Exception):
    """Raised by a claim job so its transaction is undone."""


def claim_cost(database: str, repeats: int = 200, limit: int = 8) -> float:
    """Median seconds of one claim of ``limit`` due emails (the statement and the reading of
    their recipients, as the delivery threads' claim does), each undone after it is timed."""
    store = open_store(database)
    times: list[float] = []

    def claim(tx: Writes) -> None:
        started = time.perf_counter()
        claimed = tx.claim_due("bench", time.time(), 60.0, limit)
        times.append(time.perf_counter() - started)
        assert claimed, "nothing was due"
        raise _RolledBack

    try:
        for _ in range(repeats):
            try:
                store.write(claim, durable=False)
            except _RolledBack:
                pass
    finally:
        store.shutdown()
    return statistics.median(times)
