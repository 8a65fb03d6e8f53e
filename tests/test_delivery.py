"""Delivery: threads claim queued mail with a lease and hand it to the relay or the Maildir."""

from __future__ import annotations

import inspect
import mailbox
import math
import threading
import time
from collections import Counter
from dataclasses import replace
from email import message_from_bytes

import pytest
from werkzeug.test import Client

from mailsvc import create_app
from mailsvc.delivery import pool as pool_module
from mailsvc.delivery.pool import RUN_SECONDS
from mailsvc.mail.message import build_message
from mailsvc.store import LeaseLost, StoreOutage

from .conftest import VERIFIED, count_by_status, email_body, make_tenant, wait_until


@pytest.fixture
def relayed(config, clock, sink):
    config["smtp_url"] = sink.url
    app = create_app(config, clock=clock)
    yield app
    app.stop(timeout=5)


def wait_status(client, tenant, email_id, wanted, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        shown = client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()
        if shown["status"] == wanted or time.monotonic() > deadline:
            assert shown["status"] == wanted, shown
            return shown
        time.sleep(0.02)


def post(client, tenant, **fields):
    response = client.post("/v1/emails", json=email_body(**fields), headers=tenant.headers)
    assert response.status_code == 200, response.get_json()
    return response.get_json()["id"]


def queue_unsent(config, clock, count):
    """``count`` emails queued by an app that delivers nothing (a worker whose delivery has not
    started): the queue another app then drains; their tenant."""
    accepting = create_app(config, clock=clock)
    tenant = make_tenant(accepting)
    for number in range(count):
        post(Client(accepting), tenant, subject=f"m{number}")
    return tenant


class Claims:
    """Every claim ``app``'s delivery makes from now on: who made it (the claimer, or a
    sender's outcome) and how many emails it found, in :attr:`looks`; when, in :attr:`times`."""

    def __init__(self, app):
        self.looks: list[tuple[str, int]] = []
        self.times: list[float] = []
        claim = app.delivery.claim

        def counted(tx, wanted):
            found = claim(tx, wanted)
            name = threading.current_thread().name
            self.looks.append(("claimer" if name.endswith("claimer") else "sender", len(found[0])))
            self.times.append(time.monotonic())
            return found

        app.delivery.claim = counted

    def clear(self):
        del self.looks[:], self.times[:]


def drain(app, sink, count):
    """Start ``app``'s delivery, wait until the sink has ``count`` messages and each is
    recorded ``sent``, and stop it."""
    app.start()
    try:
        sink.wait_for(count, timeout=30)
        wait_until(lambda: count_by_status(app.store) == {"sent": count}, what="recorded")
    finally:
        app.stop(timeout=5)


def test_email_is_sent_through_the_relay(relayed, sink):
    tenant, client = make_tenant(relayed), Client(relayed)
    relayed.start()
    email_id = post(
        client,
        tenant,
        to=["a@example.org", "b@example.org"],
        html="<p>Thanks</p>",
        reply_to="support@example.org",
    )
    [received] = sink.wait_for(1)
    assert received.mail_from == f"hello@{VERIFIED}"
    assert received.recipients == ["a@example.org", "b@example.org"]
    message = received.message
    assert message.get_content_type() == "multipart/alternative"
    plain, html = message.get_payload()
    assert plain.get_content_type() == "text/plain" and plain.get_content_charset() == "utf-8"
    assert plain.get_content().strip() == "Thanks for your order."
    assert html.get_content_type() == "text/html" and html.get_content().strip() == "<p>Thanks</p>"
    assert message["Reply-To"] == "support@example.org"
    assert message["From"] == f"Acme <hello@{VERIFIED}>"
    assert message["Message-ID"] == f"<{email_id}@{VERIFIED}>"
    assert message["Date"] is not None
    shown = wait_status(client, tenant, email_id, "sent")
    assert shown["sentAt"] is not None and shown["lastError"] is None and shown["attempts"] == 1
    assert [r["status"] for r in shown["recipients"]] == ["sent", "sent"]
    assert shown["recipients"][0]["smtpCode"] == 250
    assert shown["recipients"][0]["enhancedCode"] == "2.0.0"


def test_text_only_and_html_only_bodies(relayed, sink):
    tenant, client = make_tenant(relayed), Client(relayed)
    relayed.start()
    post(client, tenant, subject="plain")
    post(client, tenant, subject="html", text=None, html="<b>hi</b>")
    received = {m.message["Subject"]: m.message for m in sink.wait_for(2)}
    assert received["plain"].get_content_type() == "text/plain"
    assert received["html"].get_content_type() == "text/html"


def test_non_ascii_subject_and_name_are_encoded(relayed, sink):
    tenant, client = make_tenant(relayed), Client(relayed)
    relayed.start()
    post(client, tenant, from_=f"Zoë Café <hello@{VERIFIED}>", subject="Reçu n° 42 ✓", text="Grüße")
    [received] = sink.wait_for(1)
    head = received.data.split(b"\r\n\r\n", 1)[0]
    assert head.isascii(), "headers are RFC 2047 encoded for a relay"
    assert b"=?utf-8?" in head.lower()
    assert received.message["Subject"] == "Reçu n° 42 ✓"
    assert str(received.message["From"]) == f"Zoë Café <hello@{VERIFIED}>"
    assert received.message.get_content().strip() == "Grüße"


def test_message_id_and_date_are_stable_across_builds(relayed):
    tenant, client = make_tenant(relayed), Client(relayed)
    email_id = post(client, tenant)
    with relayed.store.read() as tx:
        record = tx.get_email(tenant.id, email_id)
    first, second = build_message(record), build_message(record)
    header = lambda raw, name: [x for x in raw.split(b"\r\n") if x.startswith(name)]  # noqa: E731
    assert (
        header(first, b"Message-ID:")
        == header(second, b"Message-ID:")
        == [f"Message-ID: <{email_id}@{VERIFIED}>".encode()]
    )
    assert header(first, b"Date:") == header(second, b"Date:")


def test_refused_recipient_fails_with_the_relay_reply(relayed, sink):
    sink.behaviour.rcpt_replies["nobody@example.org"] = (550, "5.1.1 no such user")
    tenant, client = make_tenant(relayed), Client(relayed)
    relayed.start()
    email_id = post(client, tenant, to="nobody@example.org")
    shown = wait_status(client, tenant, email_id, "failed")
    assert "550" in shown["lastError"] and "no such user" in shown["lastError"]
    assert shown["recipients"][0] == {
        "address": "nobody@example.org",
        "kind": "to",
        "status": "failed",
        "smtpCode": 550,
        "enhancedCode": "5.1.1",
        "reply": "5.1.1 no such user",
    }
    assert sink.messages == []


def test_message_refused_after_data_fails(relayed, sink):
    sink.behaviour.data_reply = lambda data: (554, "5.7.1 rejected as spam")
    tenant, client = make_tenant(relayed), Client(relayed)
    relayed.start()
    email_id = post(client, tenant)
    shown = wait_status(client, tenant, email_id, "failed")
    assert "554" in shown["lastError"] and "rejected as spam" in shown["lastError"]


def test_status_is_sending_while_the_relay_works(relayed, sink):
    sink.behaviour.delay_seconds = 0.3
    tenant, client = make_tenant(relayed), Client(relayed)
    relayed.start()
    email_id = post(client, tenant)
    wait_status(client, tenant, email_id, "sending", timeout=2)
    wait_status(client, tenant, email_id, "sent")


def test_new_email_wakes_delivery_at_once(config, clock, sink):
    config.update(smtp_url=sink.url, poll_seconds=30)
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    app.start()
    try:
        # The threads have looked, found nothing, and sleep for 30 s.
        wait_until(lambda: app.delivery.claims >= 1, what="the first look")
        started = time.monotonic()
        post(client, tenant)
        sink.wait_for(1, timeout=5)
        assert time.monotonic() - started < 1.0
    finally:
        app.stop(timeout=5)


def test_every_thread_delivery_starts_is_named_for_what_it_does(config, sink):
    """A profile or a dump of a delivering process (py-spy, ``tests.bench.profile``) names each
    thread: the claimer, the senders, the lease keeper and the listener for news."""
    config["smtp_url"] = sink.url
    app = create_app(config)
    before = set(threading.enumerate())
    app.start()
    try:
        wait_until(lambda: app.delivery.claims >= 1, what="the first look")
        started = {thread.name for thread in set(threading.enumerate()) - before}
    finally:
        app.stop(timeout=5)
    assert {
        "mailsvc-sender-claimer",
        "mailsvc-sender-0",
        "mailsvc-sender-keep_leases",
        "mailsvc-sender-listen",  # (both backends announce new mail to those that deliver)
    } <= started, started
    assert all(name.startswith("mailsvc-") for name in started), started


def test_mail_that_comes_one_at_a_time_is_claimed_once_each(config, clock, sink):
    """Where every new email is announced, a thread that recorded its email does not look for
    a next run that nothing announced: one claim an email (the claimer's), not two. An email
    announced while every thread sends is claimed by the job that records what one sent."""
    config.update(smtp_url=sink.url, poll_seconds=30, delivery_threads=2)
    app = create_app(config, clock=clock)
    assert app.store.announces_mail
    tenant, client = make_tenant(app), Client(app)
    claims = Claims(app)
    looks = claims.looks  # (who claimed, how many it found)
    app.start()
    try:
        # (the start's looks over: the listener's first wait wakes the claimer too)
        post(client, tenant, subject="first")
        sink.wait_for(1, timeout=5)
        wait_until(lambda: count_by_status(app.store).get("sent") == 1, what="sent")
        time.sleep(0.2)
        del looks[:]
        for number in range(1, 6):
            post(client, tenant, subject=f"m{number}")
            sink.wait_for(number + 1, timeout=5)
            sent = number + 1
            wait_until(lambda n=sent: count_by_status(app.store).get("sent") == n, what="sent")
        assert looks == [("claimer", 1)] * 5, looks
        del looks[:]
        sink.behaviour.delay_seconds = 0.3  # the next messages take a while at the relay
        for number in range(2):
            post(client, tenant, subject=f"slow {number}")
            wait_until(lambda n=number: looks == [("claimer", 1)] * (n + 1), what="claimed")
        post(client, tenant, subject="while both threads send")
        sink.wait_for(9, timeout=10)
        assert looks[2] == ("sender", 1) and all(n == 0 for _, n in looks[3:]), looks
    finally:
        app.stop(timeout=5)


def test_mail_that_comes_faster_than_the_gathering_goes_in_runs(config, clock, sink):
    """While mail comes one email at a time (the last claim found the queue short), the
    claimer claims at most once every ``MAILSVC_DELIVERY_GATHER_MS``, and what came meanwhile
    goes in runs, each sent by one thread and recorded in one transaction: as many emails a
    run as the relay takes in a run's time (all five from a sink on this machine). An email
    after a quiet spell longer than that is claimed at once."""
    gather = 0.3
    config.update(
        smtp_url=sink.url, poll_seconds=30, delivery_threads=8, delivery_gather_ms=gather * 1000
    )
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    claims = Claims(app)
    record, run_of = app.delivery.record, app.delivery.gathered_run
    recorded: list[int] = []  # the sink's count at each record
    runs: list[int] = []  # what each gathered claim took as a run

    def counted_record(job, claims=False):
        result = record(job, claims)
        recorded.append(len(sink.messages))
        return result

    def counted_run():
        runs.append(run_of())
        return runs[-1]

    app.delivery.record, app.delivery.gathered_run = counted_record, counted_run
    app.start()
    try:
        for number in range(3):  # the relay's pace, measured (a connection opened first)
            post(client, tenant, subject=f"warm {number}")
            sink.wait_for(number + 1, timeout=5)
        wait_until(lambda: count_by_status(app.store).get("sent") == 3, what="sent")
        time.sleep(gather * 1.2)  # a quiet spell
        claims.clear()
        del recorded[:], runs[:]
        posted = time.monotonic()
        post(client, tenant, subject="alone")
        sink.wait_for(4, timeout=5)
        assert claims.looks == [("claimer", 1)], claims.looks
        assert claims.times[0] - posted < gather / 2, "claimed at once, not after a gathering"
        wait_until(lambda: count_by_status(app.store).get("sent") == 4, what="sent")
        for number in range(5):  # each announced as it is queued, within the gathering
            post(client, tenant, subject=f"m{number}")
        sink.wait_for(9, timeout=10)
        wait_until(lambda: count_by_status(app.store).get("sent") == 9, what="sent")
    finally:
        app.stop(timeout=5)
    assert claims.looks == [("claimer", 1), ("claimer", 5)], claims.looks
    assert claims.times[1] - claims.times[0] >= gather * 0.95, "the second waited for the rest"
    # A sink on loopback takes a message in well under half a run's time: runs of two at least,
    # each recorded in one transaction (five emails: fewer records than emails).
    run = runs[-1]
    assert run >= 2, runs
    assert recorded[0] == 4 and len(recorded) == 1 + math.ceil(5 / run), (recorded, runs)
    assert len({m.message_id for m in sink.messages}) == 9


def test_mail_that_keeps_coming_one_at_a_time_is_gathered_not_claimed_by_each_sender(
    config, clock, sink
):
    """While mail keeps coming one email at a time (the last claim found the queue short), a
    thread that recorded its run does not claim what came meanwhile (an email or two, a run
    and a durable commit each) before the gathering's time has passed since the last claim:
    the claimer gathers it. (A claim that found a full run means a backlog, which the threads
    claim as they free up.)"""
    gather, run = 0.1, 8
    config.update(
        smtp_url=sink.url,
        poll_seconds=30,
        delivery_threads=4,
        delivery_gather_ms=gather * 1000,
        delivery_run=run,
    )
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    claims = Claims(app)
    app.start()
    try:
        for number in range(3):  # the relay's pace, measured
            post(client, tenant, subject=f"warm {number}")
            sink.wait_for(number + 1, timeout=5)
        wait_until(lambda: count_by_status(app.store).get("sent") == 3, what="sent")
        time.sleep(gather * 1.5)  # a quiet spell
        claims.clear()
        for number in range(40):  # one every 10 ms or so: a run or less a gathering
            post(client, tenant, subject=f"m{number}")
            time.sleep(0.01)
        sink.wait_for(43, timeout=10)
        wait_until(lambda: count_by_status(app.store).get("sent") == 43, what="sent")
    finally:
        app.stop(timeout=5)
    looks = [
        (who, found, at)
        for (who, found), at in zip(claims.looks, claims.times, strict=True)
        if found
    ]
    assert sum(found for _, found, _ in looks) == 40
    for before, (who, found, at) in zip(looks, looks[1:], strict=False):
        if who == "sender" and found < run:  # a piece or two, while mail came one at a time
            assert before[1] == run or at - before[2] >= gather * 0.9, looks
    assert len({m.message_id for m in sink.messages}) == 43


def test_gathered_mail_from_a_slow_relay_goes_side_by_side(config, clock, sink):
    """A relay that takes longer than a run's time (RUN_SECONDS) for a message gets gathered
    mail one email to an idle thread, sent side by side, not as one thread's run (which the
    first message would end, the rest given back and claimed again)."""
    gather = 0.5
    config.update(
        smtp_url=sink.url, poll_seconds=30, delivery_threads=3, delivery_gather_ms=gather * 1000
    )
    sink.behaviour.delay_seconds = RUN_SECONDS  # each reply: a message takes three at least
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    claims = Claims(app)
    app.start()
    try:
        wait_until(lambda: app.delivery.claims >= 1, what="the first look")
        time.sleep(gather * 1.2)
        claims.clear()
        post(client, tenant, subject="first")  # (the relay's pace, measured)
        sink.wait_for(1, timeout=10)
        wait_until(lambda: count_by_status(app.store).get("sent") == 1, what="sent")
        for number in range(3):
            post(client, tenant, subject=f"m{number}")
        sink.wait_for(4, timeout=10)
        wait_until(lambda: count_by_status(app.store).get("sent") == 4, what="sent")
    finally:
        app.stop(timeout=5)
    # One claim took the three (a thread's look for its next run may find none), and three
    # threads sent them, each on its own connection.
    assert [(who, found) for who, found in claims.looks if found] == [
        ("claimer", 1),
        ("claimer", 3),
    ]
    assert len({received.connection for received in sink.messages[1:]}) == 3


def test_connection_is_reused_between_messages(config, clock, sink):
    config.update(smtp_url=sink.url, delivery_threads=1)
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    app.start()
    try:
        for number in range(5):
            post(client, tenant, subject=f"m{number}")
            sink.wait_for(number + 1)
        assert sink.connections == 1
    finally:
        app.stop(timeout=5)


@pytest.mark.parametrize("run", [1, 8])
def test_a_thread_that_sent_its_emails_claims_its_next_run_in_the_same_transaction(
    config, clock, sink, run
):
    """A queue drained by one thread: one store transaction a run of emails (their outcomes
    and the next run's claim), not one an email and a claim, and the claimer thread looks
    once, to start."""
    config.update(smtp_url=sink.url, delivery_run=run)
    queue_unsent(config, clock, 30)
    config["delivery_threads"] = 1
    delivering = create_app(config, clock=clock)
    writes, write = [], delivering.store.write

    def counted(job, durable=True):
        writes.append(job)
        return write(job, durable)

    delivering.store.write = counted
    drain(delivering, sink, 30)
    assert len(sink.messages) == 30 and len({m.message_id for m in sink.messages}) == 30
    # (the first email alone, as the claimer handed it; then runs of the rest, each recorded
    # with the next run's claim, held to three emails on average at least, since a slow machine
    # may end a run at its 50 ms; and a few looks or renewals)
    assert len(writes) <= 1 + math.ceil(29 / min(run, 3)) + 8, len(writes)
    if run > 1:
        assert len(writes) < 29, "a thread records a run in one transaction"


def test_a_refusal_ends_a_run_and_what_it_changed_holds_for_the_rest(config, clock, sink):
    """A run goes on only while the relay takes each message: a recipient refused as unknown is
    suppressed by the job that records the refusal, and the rest of the run, given back in it,
    is claimed again knowing that (not sent to the address again)."""
    config["smtp_url"] = sink.url
    accepting = create_app(config, clock=clock)  # never started: queues while nobody delivers
    tenant, client = make_tenant(accepting), Client(accepting)
    first = post(client, tenant, to=["a@example.org"], subject="first")
    refused = post(client, tenant, to=["gone@example.org"], subject="refused")
    again = post(client, tenant, to=["gone@example.org"], subject="again")
    last = post(client, tenant, to=["b@example.org"], subject="last")
    sink.behaviour.rcpt_replies["gone@example.org"] = (550, "5.1.1 no such user")
    config.update(delivery_threads=1, delivery_run=8)
    delivering = create_app(config, clock=clock)
    delivering.start()
    try:
        wait_status(client, tenant, last, "sent")
        shown = {
            email_id: wait_status(client, tenant, email_id, status)
            for email_id, status in [(first, "sent"), (refused, "failed"), (again, "failed")]
        }
    finally:
        delivering.stop(timeout=5)
    assert shown[refused]["recipients"][0]["smtpCode"] == 550
    assert shown[again]["recipients"][0]["status"] == "suppressed"
    assert shown[again]["recipients"][0]["smtpCode"] is None  # never asked of the relay again
    assert sorted(m.message["Subject"] for m in sink.messages) == ["first", "last"]


def test_a_run_that_fails_after_its_record_gives_back_the_next_run_it_claimed(
    config, clock, sink, monkeypatch, caplog
):
    """A thread whose run fails after the job that recorded it claimed the thread's next run
    (here its log line) gives that run back: sent at once by whoever claims it, not held by
    a thread that will never send it and renewed for ever."""
    config["smtp_url"] = sink.url
    queue_unsent(config, clock, 6)
    config.update(delivery_threads=1, delivery_run=8, poll_seconds=30)
    delivering = create_app(config, clock=clock)
    report = pool_module._Attempt.report
    failures: list[str] = []

    def fails_once(attempt):
        if not failures:
            failures.append(attempt.email.id)
            raise RuntimeError("the log could not be written")
        report(attempt)

    monkeypatch.setattr(pool_module._Attempt, "report", fails_once)
    drain(delivering, sink, 6)
    assert len({m.message_id for m in sink.messages}) == 6 and failures
    assert "failed; the lease will expire" in caplog.text


def test_a_slow_relays_runs_are_of_one_email(config, clock, sink):
    """A run ends once it has been sending for RUN_SECONDS: what a crash sends again is only
    what the relay took in its last instant."""
    config["smtp_url"] = sink.url
    queue_unsent(config, clock, 6)
    # Each reply waits: MAIL, RCPT and BDAT make a message take 1.5 times the bound at least.
    sink.behaviour.delay_seconds = RUN_SECONDS / 2
    config.update(delivery_threads=1, delivery_run=8)
    delivering = create_app(config, clock=clock)
    recorded: list[int] = []
    record = delivering.delivery.record

    def counted(job, claims=False):
        result = record(job, claims)
        recorded.append(len(sink.messages))
        return result

    delivering.delivery.record = counted
    drain(delivering, sink, 6)
    # Each outcome was recorded before the next message went: the sink's count at each record.
    assert recorded == [1, 2, 3, 4, 5, 6], recorded


def test_a_run_whose_lease_on_one_email_was_lost_records_the_others(config, clock, sink, caplog):
    """Another process took over one email of a run (its lease ran out): the run's job is
    refused, and each outcome is then recorded on its own; that email's is not."""
    config["smtp_url"] = sink.url
    accepting = create_app(config, clock=clock)
    tenant, client = make_tenant(accepting), Client(accepting)
    ids = [post(client, tenant, subject=f"m{number}") for number in range(4)]
    config.update(delivery_threads=1, delivery_run=8)
    delivering = create_app(config, clock=clock)
    store = delivering.store

    def taken_over(data: bytes):
        if b"Subject: m2" in data:  # the second of the run [m1, m2, m3]: taken over meanwhile
            store.write(
                lambda tx: tx.run(
                    "UPDATE emails SET lease_owner = ? WHERE id = ?", ("another/1/x", ids[2])
                )
            )
        return None

    sink.behaviour.data_reply = taken_over
    delivering.start()
    try:
        sink.wait_for(4, timeout=30)
        for email_id in (ids[0], ids[1], ids[3]):
            wait_status(client, tenant, email_id, "sent")
    finally:
        delivering.stop(timeout=5)
    taken = client.get(f"/v1/emails/{ids[2]}", headers=tenant.headers).get_json()
    assert taken["status"] == "sending" and taken["recipients"][0]["status"] == "queued"
    assert f"email {ids[2]}: lease lost during delivery" in caplog.text


class CutRun:
    """Five emails for three threads, which each take one first: m1's thread stays busy, the
    run [m3, m4] that another thread's outcome claims is cut by a 451 for m3, and m4, given
    back, waits at the relay once the third thread has taken it (until ``goes["m4"]``)."""

    def __init__(self, config, clock, sink):
        config["smtp_url"] = sink.url
        queue_unsent(config, clock, 5)
        config.update(delivery_threads=3, delivery_run=8, poll_seconds=30)
        self.app = create_app(config, clock=clock)
        self.sink = sink
        self.arrived = {f"m{n}": threading.Event() for n in range(5)}
        self.goes = {f"m{n}": threading.Event() for n in range(5)}
        self._first_three = threading.Event()
        sink.behaviour.data_reply = self._answer

    def _answer(self, data: bytes):
        subject = message_from_bytes(data)["Subject"]
        once = not self.arrived[subject].is_set()
        self.arrived[subject].set()
        if all(self.arrived[f"m{n}"].is_set() for n in range(3)):
            self._first_three.set()
        if subject in ("m0", "m2"):  # each thread has its first email before any goes on
            self._first_three.wait(10)
        elif subject == "m1":  # one thread stays busy
            self.goes["m1"].wait(30)
        elif subject == "m3" and once:  # the run [m3, m4] is cut: m4 given back...
            return (451, "4.3.0 try again later")
        elif subject == "m4" and once:  # ...and taken by the idle thread, which waits here
            self.goes["m4"].wait(30)
        return None

    def finish(self):
        """Let the relay answer, wait for every outcome, stop; what the relay got, by subject."""
        self.goes["m4"].set()
        self.goes["m1"].set()
        try:
            wait_until(lambda: count_by_status(self.app.store) == {"sent": 4, "deferred": 1},
                       what="every outcome recorded")  # fmt: skip
        finally:
            self.app.stop(timeout=5)
        return Counter(message_from_bytes(m.data)["Subject"] for m in self.sink.messages)


def test_mail_a_cut_run_gave_back_stays_held_by_the_thread_that_took_it(
    config, clock, sink, monkeypatch
):
    """A run cut short gives back what it did not send, and another thread of the process (the
    same lease owner) may take it before the run has let go of it. It stays held: the leases
    in doubt that the process gives back once a store outage ends are never that thread's
    (before, its outcome was refused as a lost lease, and the email sent twice)."""
    cut = CutRun(config, clock, sink)
    pool, store = cut.app.delivery, cut.app.store
    report = pool_module._Attempt.report

    def slow_to_report(attempt):  # the cut run's thread lets go of its run after m4 is taken
        if attempt.email.subject == "m3":
            cut.arrived["m4"].wait(10)
        report(attempt)

    monkeypatch.setattr(pool_module._Attempt, "report", slow_to_report)
    given_back = threading.Event()
    give_back_unknown = pool.give_back_unknown

    def giving_back(tx, held):
        given = give_back_unknown(tx, held)
        given_back.set()
        return given

    pool.give_back_unknown = giving_back
    write, out = store.write, []

    def write_or_outage(job, durable=True):
        if out and getattr(job, "func", None) == pool.claim:  # (not another pool's write)
            out.pop()
            raise StoreOutage("unreachable", "the test's outage")
        return write(job, durable)

    store.write = write_or_outage
    cut.app.start()
    try:
        assert cut.arrived["m4"].wait(10), "m4 was not sent"
        # The cut run's thread has let go of its run; then a claim meets an outage, the next
        # ends it, and the claimer gives back the leases of the process that nobody here holds.
        wait_until(lambda: pool._idle == 1, what="the cut run's thread idle")
        out.append(True)
        pool.wake()
        wait_until(lambda: not out, what="a claim that met the outage")
        pool.wake()
        assert given_back.wait(10), "the leases in doubt were not given back"
    finally:
        received = cut.finish()
    assert received == {"m0": 1, "m1": 1, "m2": 1, "m4": 1}


def test_a_record_whose_commit_was_in_doubt_gives_back_nothing_again(config, clock, sink):
    """The job that records a cut run commits, but its answer is lost (the connection went
    with it: an outage), and m4, which it gave back, is taken by another thread meanwhile.
    Done again, the job is refused (its leases are gone): the run does not give m4 back a
    second time, from under the thread that holds it now (before: the email sent twice)."""
    cut = CutRun(config, clock, sink)
    pool, store = cut.app.delivery, cut.app.store
    write, in_doubt = store.write, []

    def answer_lost(job, durable=True):
        result = write(job, durable)
        closure = inspect.getclosurevars(job) if inspect.isfunction(job) else None
        attempts = closure.nonlocals.get("attempts", []) if closure else []
        if not in_doubt and any(attempt.email.subject == "m3" for attempt in attempts):
            in_doubt.append(job)
            pool.wake()  # new mail: the idle thread takes m4
            assert cut.arrived["m4"].wait(10)
            raise StoreOutage("unreachable", "the test's lost COMMIT")
        return result

    store.write = answer_lost
    cut.app.start()
    try:
        wait_until(lambda: in_doubt and pool._idle == 1, what="the cut run recorded, again")
    finally:
        received = cut.finish()
    assert received == {"m0": 1, "m1": 1, "m2": 1, "m4": 1}


def test_mail_queued_by_another_process_is_picked_up(config, clock, sink):
    config["smtp_url"] = sink.url
    accepting = create_app(config, clock=clock)  # never started: like a worker without delivery
    delivering = create_app(config, clock=clock)
    tenant = make_tenant(accepting)
    post(Client(accepting), tenant)
    delivering.start()
    try:
        sink.wait_for(1, timeout=5)
    finally:
        delivering.stop(timeout=5)


def test_lease_keeps_others_away_until_it_expires(relayed, clock):
    tenant, client = make_tenant(relayed), Client(relayed)
    email_id = post(client, tenant)
    store = relayed.store
    [claimed] = store.write(lambda tx: tx.claim_due("worker-a", clock(), lease_seconds=60))
    assert claimed.id == email_id and claimed.status == "sending"
    assert store.write(lambda tx: tx.claim_due("worker-b", clock(), lease_seconds=60)) == []
    clock.advance(61)  # worker-a died mid-send
    [again] = store.write(lambda tx: tx.claim_due("worker-b", clock(), lease_seconds=60))
    assert again.id == email_id and again.attempts == 2

    following = post(client, tenant)
    events = len(store.reads.email_events([again.seq])[again.seq])

    def record(owner):
        """The job a sender runs: the outcome, and the thread's next email claimed with it."""

        def job(tx):
            sent = [(0, replace(again.recipients[0], status="sent", smtp_code=250))]
            tx.finish_attempt(again, owner, "sent", sent, clock(), None, None)
            return tx.claim_to_send(owner, clock(), 60)

        return store.write(job)

    with pytest.raises(LeaseLost):  # and nothing of its job is kept, its claim neither
        record("worker-a")
    assert store.reads.get_email(again.account_id, email_id).status == "sending"
    assert store.reads.get_email(again.account_id, email_id).recipients[0].status == "queued"
    assert len(store.reads.email_events([again.seq])[again.seq]) == events
    assert store.reads.get_email(again.account_id, following).status == "queued"
    [claimed_next], _ = record("worker-b")
    assert claimed_next.id == following
    assert store.reads.get_email(again.account_id, email_id).status == "sent"
    assert store.reads.get_email(again.account_id, email_id).recipients[0].status == "sent"


def test_without_a_relay_mail_goes_to_the_maildir(app, config):
    tenant, client = make_tenant(app), Client(app)
    app.start()
    email_id = post(client, tenant, to=["a@example.org", "b@example.org"])
    shown = wait_status(client, tenant, email_id, "sent")
    reply = shown["recipients"][0]["reply"]
    assert reply == "2.0.0 delivered to the local outbox (Maildir)"
    assert config["outbox"] not in reply and "/" not in reply  # no path of the server's
    [message] = list(mailbox.Maildir(config["outbox"]))
    assert message["Message-ID"] == f"<{email_id}@{VERIFIED}>"
    assert message.get_all("Delivered-To") == ["a@example.org", "b@example.org"]


def test_a_transaction_longer_than_a_lease_is_not_taken_over(config, sink):
    """The leases a process holds are renewed while it sends: another process (here a second
    app on the same file) never takes over a slow transaction, so nothing is sent twice."""
    config.update(smtp_url=sink.url, lease_seconds=0.6, poll_seconds=0.05)
    first, second = create_app(config), create_app(config)
    tenant, client = make_tenant(first), Client(first)
    sink.behaviour.delay_seconds = 0.3  # six replies: one transaction takes about 1.8 s
    email_id = post(client, tenant)
    first.start()
    second.start()
    try:
        shown = wait_status(client, tenant, email_id, "sent", timeout=15)
    finally:
        # A graceful stop waits for the transactions in flight: a take-over's, had there been
        # one, has reached the sink by then.
        first.stop(timeout=15)
        second.stop(timeout=15)
    assert [m.message_id for m in sink.messages] == [f"<{email_id}@{VERIFIED}>"]
    assert shown["attempts"] == 1
