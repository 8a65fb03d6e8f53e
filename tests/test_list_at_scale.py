"""Lists that stay fast as the store grows: ``GET /v1/emails?to=`` and ``?tag=`` walk an index
of the account's own recipients and tags, newest first, and stop at the page's end; a store
made before that index is upgraded in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import Client

from mailsvc import create_app
from mailsvc.store.records import EmailFilter
from mailsvc.store.sqlite import DIALECT
from mailsvc.store.verbs import SqlVerbs

from .conftest import email_body, make_tenant
from .test_delivery import post

TAG = {"name": "category", "value": "receipt"}


def listed(client: Client, tenant: Any, query: str) -> list[str]:
    response = client.get(f"/v1/emails?{query}", headers=tenant.headers)
    assert response.status_code == 200, response.get_json()
    return [email["id"] for email in response.get_json()["data"]]


def test_each_account_finds_only_its_own_mail_to_an_address_or_with_a_tag(app, client):
    mine, theirs = make_tenant(app), make_tenant(app, domain="other.test")
    their_ids = [
        client.post(
            "/v1/emails",
            json=email_body(from_="x@other.test", to="shared@example.org", tags=[TAG]),
            headers=theirs.headers,
        ).get_json()["id"]
        for _ in range(3)
    ]
    my_ids = [post(client, mine, to="shared@example.org", tags=[TAG]) for _ in range(2)]
    post(client, mine, to="someone@example.org")
    assert listed(client, mine, "to=shared@example.org") == my_ids[::-1]
    assert listed(client, mine, "tag=category:receipt") == my_ids[::-1]
    assert listed(client, theirs, "to=shared@example.org&tag=category:receipt") == their_ids[::-1]
    assert listed(client, mine, "to=shared@example.org&limit=1")[0] == my_ids[-1]


def test_paging_by_recipient_keeps_the_order_across_pages(app, client):
    tenant = make_tenant(app)
    ids = [post(client, tenant, to=["a@example.org", f"n{n}@example.org"]) for n in range(7)]
    seen, cursor = [], ""
    while True:
        page = client.get(
            f"/v1/emails?to=a@example.org&limit=3{cursor}", headers=tenant.headers
        ).get_json()
        seen += [email["id"] for email in page["data"]]
        if not page["hasMore"]:
            break
        cursor = f"&cursor={page['nextCursor']}"
    assert seen == ids[::-1]


def _turn_back_to_version_10(backend: str, database: str) -> str:
    """The database as mailsvc left it before the index existed (migration 10), and the
    ``MAILSVC_DATABASE`` to open it with."""
    undo = [
        "DROP TABLE email_bodies",  # migration 17
        "DROP TABLE daily_outcomes",  # migration 15 (which dropped 14's index too)
        "DROP TABLE dashboard_sessions",  # migration 14
        "DROP INDEX emails_waiting_for_relay",  # migration 12
        "ALTER TABLE emails DROP COLUMN waits_for_relay_since",
        "DROP INDEX recipients_by_account_address",
        "ALTER TABLE recipients DROP COLUMN account_id",
        "CREATE INDEX recipients_by_address ON recipients (address)",
        "DROP INDEX email_tags_by_account_tag",
        "ALTER TABLE email_tags DROP COLUMN account_id",
        "CREATE INDEX email_tags_by_tag ON email_tags (name, value, email_seq)",
    ]
    if backend == "sqlite":
        # A copy (through SQLite, so that what is still in the WAL comes too): a file this
        # process has not migrated yet.
        older = str(Path(database).with_name("older.sqlite3"))
        source, connection = sqlite3.connect(database), sqlite3.connect(older)
        source.backup(connection)
        source.close()
        with connection:
            for statement in undo:
                connection.execute(statement)
            connection.execute("PRAGMA user_version = 10")
        connection.close()
        return older
    import psycopg

    with psycopg.connect(database, autocommit=True) as connection:
        connection.execute("DROP FUNCTION mailsvc_refuse(text)")  # migration 16
        for statement in undo:
            connection.execute(statement)
        connection.execute(
            "DELETE FROM schema_migrations WHERE version IN (11, 12, 14, 15, 16, 17)"
        )
    return database


def test_a_store_from_before_the_index_is_upgraded_and_lists_by_recipient_and_tag(
    config, backend, database
):
    first = create_app(config)
    tenant = make_tenant(first)
    tagged = post(Client(first), tenant, to="alice@example.org", tags=[TAG])
    post(Client(first), tenant, to="bob@example.org")
    first.stop(graceful=True, timeout=5)

    upgraded = create_app({**config, "database": _turn_back_to_version_10(backend, database)})
    try:
        client = Client(upgraded)
        assert listed(client, tenant, "to=alice@example.org") == [tagged]
        assert listed(client, tenant, "tag=category:receipt") == [tagged]
        later = post(client, tenant, to="alice@example.org", tags=[TAG])
        assert listed(client, tenant, "to=alice@example.org&tag=category:receipt") == [
            later,
            tagged,
        ]
    finally:
        upgraded.stop(graceful=True, timeout=5)


class _Planning:
    """A connection that records SQLite's plan of every statement before running it."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.plans: list[str] = []

    def execute(self, sql: str, parameters: Any = ()) -> sqlite3.Cursor:
        plan = self.connection.execute(f"EXPLAIN QUERY PLAN {sql}", parameters).fetchall()
        self.plans.append(" | ".join(row[3] for row in plan))
        return self.connection.execute(sql, parameters)


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("where", "index"),
    [
        (EmailFilter(recipient="a@example.org"), "recipients_by_account_address"),
        (EmailFilter(tag=("category", "receipt")), "email_tags_by_account_tag"),
        (
            EmailFilter(recipient="a@example.org", tag=("category", "receipt"), status="sent"),
            "recipients_by_account_address",
        ),
    ],
)
def test_a_filtered_list_walks_the_index_without_scanning_or_sorting(
    open_test_store, database, where, index
):
    open_test_store().reads.count_emails_by_status()  # the schema, made at first use
    connection = sqlite3.connect(database)
    planning = _Planning(connection)
    verbs = SqlVerbs(planning, DIALECT)
    for before in (None, 1000):
        verbs.list_emails("acc_x", where, before, 20)
    connection.close()
    for plan in planning.plans:
        assert f"USING COVERING INDEX {index}" in plan or f"USING INDEX {index}" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # no sort: the index gives the order
        assert "SCAN" not in plan, plan


@pytest.mark.sqlite_only
def test_the_emails_waiting_for_the_relay_are_found_without_a_scan_of_the_others(
    open_test_store, database
):
    open_test_store().reads.count_emails_by_status()  # the schema, made at first use
    connection = sqlite3.connect(database)
    planning = _Planning(connection)
    SqlVerbs(planning, DIALECT).due_again_after_outage(100.0, 500)
    connection.close()
    [plan] = planning.plans
    # Only that index's rows are read: it holds no other email, whatever the store's size.
    assert "SCAN emails USING INDEX emails_waiting_for_relay" in plan, plan
    assert "SCAN emails |" not in plan + " |" and "TEMP B-TREE" not in plan, plan
