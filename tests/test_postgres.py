"""What PostgreSQL adds: choosing it, its schema and migrations, mail announced to every host,
moving an SQLite store there, and two hosts on one database."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from urllib.parse import quote

import psycopg
import pytest
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.store import SqliteStore, StoreOutage, open_store
from mailsvc.store.postgres import PostgresStore
from mailsvc.timestamps import iso_time

from .conftest import (
    VERIFIED,
    count_by_status,
    delivery_caught_up,
    email_body,
    make_tenant,
    run_cli,
    wait_until,
)
from .servers import ROOT, Gunicorn, another_machine, request

pytestmark = pytest.mark.postgres_only


def test_the_url_chooses_the_backend(database, tmp_path):
    for url in (database, database.replace("postgresql://", "postgres://", 1)):
        store = open_store(url)
        assert isinstance(store, PostgresStore) and store.backend == "postgresql"
        assert store.reads.get_account("acc_none") is None  # it connects
        store.shutdown()
    assert isinstance(open_store(str(tmp_path / "x.sqlite3")), SqliteStore)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://postgres@127.0.0.1:1/nothing", "cannot connect"),
        ("postgresql://[bad", "not a PostgreSQL URL"),
        ("postgres://no_such_role@127.0.0.1:5432/postgres", "cannot connect"),
    ],
)
def test_a_bad_url_or_server_is_one_line_at_start_up(url, said):
    env = {**os.environ, "MAILSVC_DATABASE": url}
    server = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "-b", "127.0.0.1:0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    cli = run_cli({"MAILSVC_DATABASE": url}, "accounts", "create", "--name", "x")
    for result in (server, cli):
        lines = [line for line in result.stderr.splitlines() if "[INFO]" not in line]
        assert result.returncode != 0
        assert len(lines) == 1 and lines[0].startswith("mailsvc: MAILSVC_DATABASE: "), lines
        assert said in lines[0] and "Traceback" not in result.stderr


def test_many_processes_starting_at_once_migrate_exactly_once(database):
    starters = [
        subprocess.Popen(
            [sys.executable, "-c", "import sys\nfrom mailsvc.store import open_store\n"
             "open_store(sys.argv[1]).reads.get_account('acc_none')", database],
            cwd=ROOT, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(6)
    ]  # fmt: skip
    for starter in starters:
        assert starter.wait(60) == 0, starter.stderr.read() if starter.stderr else ""
        if starter.stderr:
            starter.stderr.close()
    with psycopg.connect(database, autocommit=True) as connection:
        applied = connection.execute(
            "SELECT version, applied_by FROM schema_migrations ORDER BY version"
        ).fetchall()
        types = dict(
            connection.execute(
                "SELECT table_name || '.' || column_name, data_type "
                "FROM information_schema.columns WHERE table_schema = current_schema()"
            ).fetchall()
        )
    scripts = sorted((ROOT / "mailsvc/store/migrations/postgres").glob("*.sql"))
    assert [version for version, _ in applied] == list(range(1, len(scripts) + 1))
    assert len({who for _, who in applied}) == 1  # one process did it all
    assert types["emails.seq"] == "bigint" and types["emails.created_at"] == "double precision"
    assert types["events.detail"] == types["emails.variables"] == "jsonb"
    assert types["api_keys.secret_hash"] == types["service_secrets.value"] == "bytea"


def test_new_mail_wakes_delivery_on_another_host_at_once(config, clock, sink, monkeypatch):
    """By ``NOTIFY``: the hosts are on machines of their own. (On one machine, by datagram:
    the store contract's test of announcements.)"""
    config.update(smtp_url=sink.url, poll_seconds=30.0)  # polling alone would take 30 s
    monkeypatch.setenv("XDG_RUNTIME_DIR", another_machine()["XDG_RUNTIME_DIR"])
    delivering = create_app(config, clock=clock)
    monkeypatch.setenv("XDG_RUNTIME_DIR", another_machine()["XDG_RUNTIME_DIR"])
    accepting = create_app(config, clock=clock)  # another host: it does not deliver
    tenant = make_tenant(accepting)
    delivering.start()
    try:
        # The delivering host has looked once, found nothing, and now waits.
        wait_until(lambda: delivering.delivery.claims >= 1, what="the first look")
        started = time.monotonic()
        answer = Client(accepting).post("/v1/emails", json=email_body(), headers=tenant.headers)
        assert answer.status_code == 200
        [received] = sink.wait_for(1, timeout=10)
        assert time.monotonic() - started < 3.0
        assert received.message_id == f"<{answer.get_json()['id']}@{VERIFIED}>"
    finally:
        delivering.stop()
        accepting.stop()


def test_migrate_data_moves_everything_and_queued_mail_is_delivered_once(
    tmp_path, database, sink, clock
):
    sqlite_config = {"database": str(tmp_path / "old.sqlite3"), "outbox": str(tmp_path / "o")}
    old = create_app(sqlite_config, clock=clock)  # delivery never starts here
    tenant = make_tenant(old)
    client = Client(old)
    template = client.post(
        "/v1/templates", json={"name": "w", "text": "Hi {{ n }}"}, headers=tenant.headers
    ).get_json()
    keyed = {**tenant.headers, "Idempotency-Key": "order-1"}
    first = client.post("/v1/emails", json=email_body(), headers=keyed).get_json()
    queued = [first["id"]] + [
        client.post(
            "/v1/emails", json=email_body(to=f"r{n}@example.org"), headers=tenant.headers
        ).get_json()["id"]
        for n in range(4)
    ]
    cursor = client.get("/v1/emails?limit=2", headers=tenant.headers).get_json()["nextCursor"]
    receipt = bytes(range(256)) * 4
    rich = client.post(
        "/v1/emails",
        json=email_body(
            to="Alice Smith <alice@example.org>",
            cc="carol@example.org",
            bcc="dave@example.org",
            replyTo=["Help <help@example.org>"],
            headers={"X-Order": "42"},
            tags=[{"name": "kind", "value": "receipt"}],
            attachments=[{"filename": "r.pdf", "content": base64.b64encode(receipt).decode()}],
            scheduledAt=iso_time(clock() + 3600),
            html="<p>" + "x" * 70_000 + "</p>",  # large: kept apart, in email_bodies
        ),
        headers=tenant.headers,
    ).get_json()["id"]
    before = {
        email_id: client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()
        for email_id in [*queued, rich]
    }
    old.stop()

    source = {"MAILSVC_DATABASE": sqlite_config["database"]}
    moved = run_cli(source, "migrate-data", "--to", database)
    assert moved.returncode == 0, moved.stderr
    report = json.loads(moved.stdout)
    assert report["copied"]["emails"] == 6 and report["copied"]["accounts"] == 1
    assert report["copied"]["recipients"] == 8 and report["copied"]["idempotency_keys"] == 1
    assert report["copied"]["attachments"] == 1 and report["copied"]["email_tags"] == 1
    assert report["copied"]["email_bodies"] == 1
    again = run_cli(source, "migrate-data", "--to", database)
    assert again.returncode == 1 and "the PostgreSQL store is not empty" in again.stderr

    new = create_app({"database": database, "smtp_url": sink.url, "poll_seconds": 0.2}, clock=clock)
    moved_client = Client(new)
    try:
        replay = moved_client.post("/v1/emails", json=email_body(), headers=keyed)
        assert replay.headers["Idempotent-Replayed"] == "true" and replay.get_json() == first
        page = moved_client.get(f"/v1/emails?limit=2&cursor={cursor}", headers=tenant.headers)
        assert [email["id"] for email in page.get_json()["data"]] == queued[2::-1][:2]
        shown = moved_client.get(f"/v1/templates/{template['id']}", headers=tenant.headers)
        assert shown.get_json()["text"] == "Hi {{ n }}"
        for email_id, seen in before.items():  # everything an email is, as the API shows it
            assert (
                moved_client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()
                == seen
            )
        new.start()
        sink.wait_for(5, timeout=20)
        # Delivery has looked since (the marker, due after them all, has arrived): no second
        # delivery of any, and the scheduled one is not due.
        marker = delivery_caught_up(moved_client, tenant, sink)
        received = Counter(message.message_id for message in sink.messages)
        once = {f"<{email_id}@{VERIFIED}>": 1 for email_id in [*queued, marker]}
        assert received == Counter(once)
        clock.advance(3600)
        new.delivery.wake()
        arrived = sink.wait_for(7, timeout=20)[-1]
        assert arrived.message_id == f"<{rich}@{VERIFIED}>"
        assert sorted(arrived.recipients) == [
            "alice@example.org",
            "carol@example.org",
            "dave@example.org",
        ]
        assert arrived.message["X-Order"] == "42" and "Bcc" not in arrived.message
        [file] = list(arrived.message.iter_attachments())
        assert file.get_filename() == "r.pdf" and file.get_content() == receipt
        after = moved_client.post("/v1/emails", json=email_body(), headers=tenant.headers)
        assert after.status_code == 200
    finally:
        new.stop()


# -- two hosts, one database ---------------------------------------------------------------------


@pytest.fixture
def two_hosts(served_tenant, sink):
    path, store, account_id, headers = served_tenant
    settings = {
        "MAILSVC_DATABASE": path,
        "MAILSVC_SMTP_URL": sink.url,
        "MAILSVC_LEASE_SECONDS": "3",
        "MAILSVC_POLL_SECONDS": "0.5",
    }
    hosts = [Gunicorn({**settings, **another_machine()}, workers=2).start() for _ in range(2)]
    yield hosts, store, account_id, headers
    for host in hosts:
        if host.process is not None and host.process.poll() is None:
            host.stop()


def spread(hosts, requests):
    """Send ``requests`` at once, alternating between the hosts; their answers, in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(
            pool.map(
                lambda numbered: request(hosts[numbered[0] % 2].port, *numbered[1]),
                enumerate(requests),
            )
        )


@pytest.mark.slow
def test_two_hosts_share_credit_limits_and_revocations(two_hosts):
    hosts, store, account_id, headers = two_hosts
    # Credit: 10 credits, 30 sends of one recipient over both hosts at once.
    operator.add_credits(store, account_id, -store.reads.get_account(account_id).credits + 10)
    answers = spread(hosts, [("POST", "/v1/emails", email_body(), headers)] * 30)
    assert Counter(status for status, _ in answers) == Counter({200: 10, 402: 20})
    assert store.reads.get_account(account_id).credits == 0
    # A limit of 20 a minute is counted once for both hosts.
    operator.set_limit(store, account_id, "list", 20)
    answers = spread(hosts, [("GET", "/v1/emails?limit=1", None, headers)] * 40)
    assert Counter(status for status, _ in answers) == Counter({200: 20, 429: 20})
    # A key revoked through one host is refused by the other at once.
    key = request(hosts[0].port, "POST", "/v1/api-keys", {"name": "k", "scope": "full"}, headers)
    assert key[0] == 201
    other = {"Authorization": f"Bearer {key[1]['key']}"}
    assert request(hosts[1].port, "GET", "/v1/account", None, other)[0] == 200
    assert request(hosts[0].port, "DELETE", f"/v1/api-keys/{key[1]['id']}", None, headers)[0] == 200
    assert request(hosts[1].port, "GET", "/v1/account", None, other)[0] == 401


@pytest.mark.slow
def test_a_host_killed_mid_delivery_leaves_its_mail_to_the_other(two_hosts, sink):
    hosts, store, account_id, headers = two_hosts
    doomed, survivor = hosts
    sink.behaviour.delay_seconds = 0.05  # slow replies: the doomed host has mail in flight
    answers = spread(hosts, [("POST", "/v1/emails", email_body(), headers)] * 80)
    assert [status for status, _ in answers] == [200] * 80
    accepted = {f"<{body['id']}@{VERIFIED}>" for _, body in answers}
    wait_until(lambda: len(sink.messages) >= 10, what="deliveries under way")
    doomed.kill_all()  # kill -9 of the whole host: master and workers
    killed_at = sink.settle()  # once the sink has read what the doomed host sent before it died
    wait_until(lambda: count_by_status(store) == {"sent": 80}, timeout=90, what="all sent")
    survivor.stop()
    received = Counter(message.message_id for message in sink.messages)
    assert set(received) == accepted
    twice = {message_id for message_id, count in received.items() if count > 1}
    # Sent twice only if the sink took it in the instant of the kill: its first copy came
    # before the kill, and at most one per delivery thread the doomed host had.
    first_seen: dict[str, int] = {}
    for index, message in enumerate(sink.messages):
        first_seen.setdefault(message.message_id, index)
    assert all(first_seen[message_id] < killed_at for message_id in twice)
    assert len(twice) <= 2 * 4
    assert store.reads.get_account(account_id).credits == 100_000 - 80


def test_reads_that_need_a_service_key_never_wait_on_the_pool_they_hold(database, clock):
    # Each list seals a cursor with a key of the service's. Fetched from inside the read, the
    # first requests of a process would each hold a connection and wait for a second one.
    app = create_app({"database": database, "postgres_pool_size": 2}, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    for _ in range(3):
        client.post("/v1/emails", json=email_body(), headers=tenant.headers)
    fresh = create_app({"database": database, "postgres_pool_size": 2}, clock=clock)
    from concurrent.futures import ThreadPoolExecutor

    def page(_: int) -> int:
        return Client(fresh).get("/v1/emails?limit=1", headers=tenant.headers).status_code

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(page, range(8))) == [200] * 8
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("count", [1, 3], ids=["one email", "a batch"])
def test_a_domain_deleted_while_mail_is_queued_under_it_waits_or_refuses(database, count):
    """A sender domain deleted by another transaction while emails are being queued under it:
    the queuing waits for that transaction, then finds no verified domain and queues nothing
    (the check and the insert are one, as the contract says of enqueue_emails)."""
    import threading

    from .test_store_contract import new_email

    store = open_store(database)
    try:
        account = operator.create_account(store, "Racer", 100)["id"]
        operator.add_domain(store, account, "race.test", verified=True)
        emails = [new_email(f"em_race{n}", account, "a@race.test") for n in range(count)]
        with psycopg.connect(database) as deleting:  # a transaction left open
            deleting.execute("DELETE FROM domains WHERE name = 'race.test'")
            results: list[object] = []
            queuing = threading.Thread(
                target=lambda: results.append(store.write(lambda tx: tx.enqueue_emails(emails)))
            )
            queuing.start()
            queuing.join(0.5)
            assert queuing.is_alive()  # waiting for the delete to commit or roll back
            deleting.commit()
        queuing.join(10)
        assert results == [[None] * count]
        with store.read() as view:
            assert view.count_emails_by_status() == {}
    finally:
        store.shutdown()


@pytest.mark.parametrize("remembered", [True, False], ids=["key remembered", "key read"])
def test_an_accept_waits_on_postgresql_once(postgres_database, remembered):
    """Round trips of one accept, counted on the wire by a proxy, so that they cannot creep
    back: BEGIN, the statement that confirms the key live (and its account still suppressing
    nobody), the email's row, the rule that refuses it unless its sender domain is verified,
    its recipients, the credit, the rate-limit token and COMMIT in one message; the key, its
    bucket and whether the account suppresses anyone as this process read them for an
    earlier request (``MAILSVC_CALLER_CACHE_SECONDS``). Read live (with that setting 0, or
    once it has passed): one read more. An account that suppresses some address has its
    recipients looked up first, and its email's row is written as a batch's are (its seq
    read back): two more. The announcement of new mail goes from a thread of its own, not
    counted."""
    from .pg_proxy import CountingProxy

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_database, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    proxy = CountingProxy(f"{postgres_database}?options={quote(f'-c search_path={schema}')}")
    remember = 600 if remembered else 0
    app = create_app(
        {"database": proxy.url, "store_min_free_mb": 0, "caller_cache_seconds": remember}
    )
    read = 0 if remembered else 1
    try:
        tenant, client = make_tenant(app), Client(app)

        def trips(body: dict) -> list[int]:
            for _ in range(20):  # connections made, statements prepared (at their 5th use)
                assert (
                    client.post("/v1/emails", json=body, headers=tenant.headers).status_code == 200
                )
            counted: list[int] = []
            for _ in range(20):
                if len(counted) == 3:
                    break
                proxy.reset()
                opened = proxy.opened
                sent = client.post("/v1/emails", json=body, headers=tenant.headers)
                assert sent.status_code == 200
                # Set aside: a request during which the pool grew (a connection's start-up
                # counts), or a connection prepared a statement (at its fifth use there: a
                # connection the pool added while warming up, for the announcer, may reach it
                # only now).
                if proxy.opened == opened and not proxy.prepared():
                    counted.append(proxy.count(leave_out=b"NOTIFY"))
            assert len(counted) == 3, "a connection was made or a statement prepared every time"
            return counted

        counted = trips(email_body())
        assert counted == [1 + read] * 3, counted
        operator.add_suppression(app.store, tenant.id, "gone@example.org")
        to_both = email_body(to=["alice@example.org", "gone@example.org"])
        if remembered:  # (remembered as suppressing nobody: its write refuses, then read live)
            assert (
                client.post("/v1/emails", json=to_both, headers=tenant.headers).status_code == 200
            )
        assert max(trips(to_both)) <= 3 + read
        sent = client.post("/v1/emails", json=to_both, headers=tenant.headers).get_json()
        shown = client.get(f"/v1/emails/{sent['id']}", headers=tenant.headers).get_json()
        assert [r["status"] for r in shown["recipients"]] == ["queued", "suppressed"]
    finally:
        app.store.shutdown()
        proxy.close()


@pytest.mark.parametrize("run", [1, 8])
def test_a_delivery_run_waits_on_postgresql_four_times(postgres_database, sink, tmp_path, run):
    """Round trips of delivery, counted on the wire by a proxy, so that they cannot creep
    back: a delivery thread sends a run of emails, then records their outcomes and claims its
    next run in one message (each email's row, written only while the lease is the thread's,
    refusing the job otherwise; their recipients and events; the claim), reads the claimed
    emails' recipients, then what sending them needs, then COMMIT: four round trips a run
    (there were six an email, with runs of one)."""
    from .pg_proxy import CountingProxy

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_database, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    proxy = CountingProxy(f"{postgres_database}?options={quote(f'-c search_path={schema}')}")
    app = create_app(
        {
            "database": proxy.url,
            "store_min_free_mb": 0,
            "smtp_url": sink.url,
            "delivery_threads": 1,
            "delivery_run": run,
            "poll_seconds": 30,  # (the claimer's polls are not delivery's waits)
            "rate_send_per_minute": 100_000,
            "outbox": str(tmp_path / "outbox"),
        }
    )
    emails = 100
    try:
        tenant, client = make_tenant(app), Client(app)
        sent = [
            client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()["id"]
            for _ in range(emails)
        ]
        proxy.reset()
        app.start()
        deadline = time.monotonic() + 60
        while len(sink.messages) < emails:
            assert time.monotonic() < deadline, f"{len(sink.messages)} of {emails} delivered"
            time.sleep(0.05)
        app.stop(graceful=True, timeout=5)
        trips = proxy.count()
        assert sorted(m.message_id.strip("<>").split("@")[0] for m in sink.messages) == sorted(sent)
        assert all(
            client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()["status"]
            == "sent"
            for email_id in sent
        )
        # (with runs of eight: 79 round trips for the 100 emails, where a run ended early at
        # its 50 ms or the queue's end; held to runs of three emails on average at least)
        most = 4.5 * emails if run == 1 else 4.5 * emails / 3
        assert trips <= most, f"{trips} round trips for {emails} emails"
    finally:
        app.store.shutdown()
        proxy.close()


def test_prepared_statements_outlive_transactions_the_server_refused_midway(config, clock):
    """Statements are prepared on a connection, often in the pipeline that sends a transaction
    with its COMMIT. When a rule refuses that transaction midway (a sender domain not
    verified, credit that has run out), the server skips what followed, the PREPAREs among it:
    they must not be counted as made (psycopg would, for a statement prepared at its fifth
    run). One connection, runs of each kind of refusal and refusals between accepted emails:
    each answered as it should be, none with a statement the server does not have; and the
    statements are prepared."""
    config["postgres_pool_size"] = 1
    app = create_app(config, clock=clock)
    try:
        client = Client(app)
        paying = make_tenant(app, credits=10_000)
        broke = make_tenant(app, credits=0, domain="broke.example")
        unverified = email_body(**{"from": "Shop <shop@unverified.example>"})
        answers: Counter[int] = Counter()
        accepted = (email_body(), paying, 200)
        to_two = (email_body(to=["a@example.org", "b@example.org"]), paying, 200)
        no_credit = (email_body(**{"from": "a@broke.example"}), broke, 402)
        not_verified = (unverified, paying, 400)
        runs = [accepted] * 5 + [no_credit] * 8 + [not_verified] * 8 + [accepted, to_two] * 4
        for body, who, expected in runs + [accepted, not_verified, to_two, no_credit] * 6:
            sent = client.post("/v1/emails", json=body, headers=who.headers)
            assert sent.status_code == expected, sent.get_json()
            answers[sent.status_code] += 1
        assert answers == {200: 25, 400: 14, 402: 14}
        with app.store.read() as view:
            assert sum(view.count_emails_by_status().values()) == 25
            assert view.get_account(paying.id).credits == 10_000 - 35
        prepared = app.store._run(
            lambda c: [row[0] for row in c.execute("SELECT statement FROM pg_prepared_statements")]
        )
        assert any(statement.startswith("INSERT INTO emails") for statement in prepared)
    finally:
        app.stop(graceful=True, timeout=5)


@pytest.mark.parametrize("server_gets_it", [True, False], ids=["committed", "never sent"])
def test_a_claim_whose_commit_went_unanswered_is_looked_up_not_left_leased(
    postgres_database, server_gets_it
):
    """A connection that breaks while a COMMIT is on its way leaves the transaction in doubt.
    A claim in doubt, reported as an outage, would leave its emails leased to nobody for a
    whole lease (two minutes). The store asks the server, on another connection, how that
    transaction ended (by its id, which came back with the claim's first answer): committed,
    the claim is handed on; never committed, the claim is made again. Either way each email
    is claimed once. An accept, whose statements all travel with its COMMIT, has no id back
    yet: it stays in doubt (a 503; a retry with its Idempotency-Key is safe)."""
    from .pg_proxy import CountingProxy
    from .test_store_contract import new_email, sender_domain

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_database, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    direct = f"{postgres_database}?options={quote(f'-c search_path={schema}')}"
    proxy = CountingProxy(direct)
    store = open_store(proxy.url)
    try:
        account = operator.create_account(store, "Doubt", 100)["id"]
        sender_domain(store, account)
        for number in range(2):
            email = new_email(f"em_doubt{number}", account, "a@verified.test")
            store.write(lambda tx, email=email: tx.enqueue_email(email))
        proxy.cut(b"COMMIT", server_gets_it)
        claimed = store.write(lambda tx: tx.claim_due("host-a", time.time(), 60, 1), False)
        assert proxy.cuts == 1
        assert [email.id for email in claimed] == ["em_doubt0"]
        with psycopg.connect(direct) as connection:
            rows = connection.execute(
                "SELECT id, status, lease_owner, attempts FROM emails ORDER BY seq"
            ).fetchall()
        assert rows == [("em_doubt0", "sending", "host-a", 1), ("em_doubt1", "queued", None, 0)]

        proxy.cut(b"COMMIT", True)  # an accept: nothing of it came back before its COMMIT
        email = new_email("em_doubt2", account, "a@verified.test")
        with pytest.raises(StoreOutage):
            store.write(lambda tx: tx.enqueue_email_or_refuse(email, lambda: ValueError()))
        assert proxy.cuts == 2
        with psycopg.connect(direct) as connection:
            assert connection.execute("SELECT count(*) FROM emails").fetchone() == (3,)
    finally:
        store.shutdown()
        proxy.close()


def test_a_claim_in_doubt_is_given_back_once_the_server_answers_not_left_for_its_lease(
    postgres_database, sink, tmp_path
):
    """The claim's COMMIT reaches the server, its answer is lost, and for two seconds the
    server cannot be asked what became of it: the claimer cannot know that the email is leased
    to it. Once the server answers again, the pool gives back the leases of its own it does not
    hold, and the email goes out at once, not when its lease (a minute here) runs out."""
    from .pg_proxy import CountingProxy

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_database, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    direct = f"{postgres_database}?options={quote(f'-c search_path={schema}')}"
    proxy = CountingProxy(direct)
    app = create_app(
        {
            "database": proxy.url,
            "store_min_free_mb": 0,
            "smtp_url": sink.url,
            "delivery_threads": 1,
            "lease_seconds": 60,
            "poll_seconds": 0.2,
            "outbox": str(tmp_path / "outbox"),
        }
    )
    try:
        tenant, client = make_tenant(app), Client(app)
        sent = client.post("/v1/emails", json=email_body(), headers=tenant.headers).get_json()
        # The COMMIT of the transaction that claims it (its UPDATE adds an attempt).
        proxy.cut(b"COMMIT", True, after=b"attempts = attempts + 1", then_out_for=2.0)
        started = time.monotonic()
        app.start()
        wait_until(lambda: proxy.cuts == 1, timeout=10, what="the claim's COMMIT cut off")
        wait_until(lambda: sink.messages, timeout=20, what="the email delivered")
        assert time.monotonic() - started < 20
        assert [m.message_id for m in sink.messages] == [f"<{sent['id']}@{VERIFIED}>"]
        with psycopg.connect(direct) as connection:
            row = connection.execute(
                "SELECT status, lease_owner, attempts FROM emails WHERE id = %s", (sent["id"],)
            ).fetchone()
        shown = f"/v1/emails/{sent['id']}"
        wait_until(
            lambda: client.get(shown, headers=tenant.headers).get_json()["status"] == "sent",
            timeout=10,
            what="its outcome recorded",
        )
        assert row is not None and row[2] == 1, "the claim given back is not counted an attempt"
    finally:
        app.stop(graceful=True, timeout=5)
        app.store.shutdown()
        proxy.close()


def test_a_queue_that_grew_after_its_claim_was_planned_is_claimed_by_its_index(
    open_test_store, database
):
    """PostgreSQL plans a statement for good after its fifth run on a connection (a generic
    plan). A queue that was small then, as a new database's is before autovacuum first
    analyzes it, and grew since, is still claimed through its index: the claim's plan on the
    connection never reads the table whole (it did, 2.4 ms a claim at 2,000 emails)."""
    from mailsvc.store import NewEmail, NewRecipient

    store = open_test_store()
    account = operator.create_account(store, "Growing", 1000)["id"]
    operator.add_domain(store, account, VERIFIED, verified=True, key_bits=1024)

    def email(number: int) -> NewEmail:
        now = time.time()
        return NewEmail(
            id=f"em_grow{number}", account_id=account, sender_name=None,
            sender_address=f"a@{VERIFIED}", recipients=(NewRecipient("b@example.org"),),
            subject="s", html=None, text="t", message_id=f"<grow{number}@x>", created_at=now,
        )  # fmt: skip

    store.write(lambda tx: tx.enqueue_emails([email(0)]))
    for _ in range(12):  # planned for good on the pool's one connection, the queue small
        store.write(lambda tx: tx.claim_due("grower", time.time() - 3600, 60.0, 8))
    store.write(lambda tx: tx.enqueue_emails([email(n) for n in range(1, 3001)]))

    def claims_plan(connection) -> str:
        row = connection.execute(
            "SELECT name, parameter_types::text[], generic_plans FROM pg_prepared_statements "
            "WHERE statement LIKE 'UPDATE emails SET status = $1, lease_owner = $2%'"
        ).fetchone()
        assert row is not None, "the claim was not prepared on the pool's connection"
        name, types, generic_plans = row
        assert generic_plans > 0, "the claim has no plan for good yet"
        values = {
            "text": "'x'",
            "double precision": "0",
            "bigint": "8",
            "integer": "8",
            "smallint": "8",
        }
        arguments = ", ".join(values[kind] for kind in types)
        plan = connection.execute(f"EXPLAIN EXECUTE {name}({arguments})").fetchall()
        connection.rollback()
        return "\n".join(line for (line,) in plan)

    plan = store._run(claims_plan)
    assert "Seq Scan on emails" not in plan, plan
    claimed = store.write(lambda tx: tx.claim_due("grower", time.time(), 60.0, 8))
    assert len(claimed) == 8


def test_the_wire_keeps_its_statements_prepared_within_their_limit(postgres_database, monkeypatch):
    """The store's statements go through :mod:`mailsvc.store.postgres.wire`: each prepared at
    its first run on a connection, the least recently used closed beyond the limit (here 3),
    while the ones in use stay; the parameters and rows convert as psycopg's would; a failed
    statement raises psycopg's error for it and leaves the statements after it unanswered
    (the COMMIT among them), and the connection usable once rolled back."""
    from mailsvc.store.postgres import wire

    monkeypatch.setattr(wire, "MOST_PREPARED", 3)
    with psycopg.connect(postgres_database, autocommit=True) as connection:
        sender = wire.wire_of(connection)
        assert wire.wire_of(connection) is sender

        def prepared() -> list[str]:
            return sorted(
                row[0]
                for row in connection.execute(
                    "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'mailsvc_%'"
                )
            )

        statements = [wire.Statement(f"SELECT ? + {n}, ?::text, ?::jsonb", (n, "é", '{"a": [1]}'))
                      for n in range(5)]  # fmt: skip
        sender.send(statements)
        assert [s.answer.fetchone() for s in statements] == [
            (2 * n, "é", {"a": [1]}) for n in range(5)
        ]
        assert len(prepared()) == 5  # (one message's new statements, closed with the next)
        again = wire.Statement("SELECT ? + 4, ?::text, ?::jsonb", (1, None, None))
        sender.send([again])  # still prepared: among the most recently used
        assert again.answer.fetchone() == (5, None, None)
        assert prepared() == [f"SELECT $1 + {n}, $2::text, $3::jsonb" for n in (2, 3, 4)]

        failing = [
            wire.Statement("SELECT 1 / ?", (0,)),
            wire.Statement("SELECT ? + 1", (1,)),
        ]
        with pytest.raises(psycopg.errors.DivisionByZero):
            sender.send([wire.utility("BEGIN"), *failing, wire.utility("COMMIT")])
        with pytest.raises(psycopg.errors.PipelineAborted):
            failing[1].answer.fetchone()
        status = psycopg.pq.TransactionStatus
        assert connection.info.transaction_status == status.INERROR  # (COMMIT skipped)
        sender.send([wire.utility("ROLLBACK")])
        assert connection.info.transaction_status == status.IDLE
        after = wire.Statement("SELECT ? + 1", (1,))  # its Parse was skipped: made again
        sender.send([after])
        assert after.answer.fetchall() == [(2,)] and after.answer.rowcount == 1
        assert len(prepared()) == 4  # (the one it made, beyond the limit until the next)
        sender.send([wire.Statement("SELECT ? + 1", (2,))])
        assert len(prepared()) == 3 and "SELECT $1 + 1" in prepared()
