"""The store's contract under concurrency (mailsvc/store/contract.py): each verb keeps its promise
on its own, with callers racing from several threads, each through a store object of its own
(its own connections, as another worker or host would have)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from mailsvc.http import idempotency
from mailsvc.mail.dkim import new_signing_key
from mailsvc.store import (
    TEMPLATE_CPU_GROUP,
    Attachment,
    Attempted,
    CreditExhausted,
    DomainExists,
    DomainTaken,
    EmailFilter,
    KeyRevoked,
    LeaseLost,
    NewEmail,
    NewRecipient,
    Recipient,
    Store,
    SuppressionsAdded,
    TokenExhausted,
    tokens_at,
)
from mailsvc.store.history import OUTCOME_SHARDS
from mailsvc.store.sqlite import DIALECT as SQLITE

RACERS = 8


def race(stores: list[Store], work: Callable[[Store, int], Any], rounds: int = 1) -> list[Any]:
    """Run ``work(store, n)`` from one thread per store, all released at once; every result."""
    for store in stores:  # connections opened (and schema checked) before the race
        store.reads.get_account("acc_warm_up")
    start = threading.Barrier(len(stores))
    results: list[Any] = []
    lock = threading.Lock()

    def run(store: Store, number: int) -> None:
        start.wait()
        for _ in range(rounds):
            try:
                outcome: Any = work(store, number)
            except Exception as exc:  # the promise may be kept by refusing: keep the refusal
                outcome = exc
            with lock:
                results.append(outcome)

    threads = [threading.Thread(target=run, args=(s, n)) for n, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


@pytest.fixture
def stores(open_test_store) -> list[Store]:
    return [open_test_store() for _ in range(RACERS)]


def new_email(
    email_id: str, account_id: str, sender: str, created_at: float = 1.0, **fields: Any
) -> NewEmail:
    fields.setdefault("recipients", (NewRecipient("b@example.org"),))
    return NewEmail(
        id=email_id,
        account_id=account_id,
        sender_name=None,
        sender_address=sender,
        subject="s",
        html=None,
        text="t",
        message_id=f"<{email_id}@x>",
        created_at=created_at,
        **fields,
    )


def sender_domain(store: Store, owner: str, name: str = "verified.test") -> None:
    key = new_signing_key(1024)
    store.write(lambda tx: tx.add_domain(f"dom_{name}", owner, name, True, key, 0.0, "token"))


def account(store: Store, credits: int = 0, name: str = "acc_racer") -> str:
    store.write(lambda tx: tx.create_account(name, "Racer", credits, 0.0))
    return name


@pytest.mark.parametrize(
    "at_its_priority", [False, True], ids=["as it is", "committing at its priority"]
)
def test_credit_is_never_overspent(stores, at_its_priority):
    """(Also where each process commits at the priority it had: ``commit_at_this_priority``.)"""
    if at_its_priority:
        for store in stores:
            store.commit_at_this_priority()
    payer = account(stores[0], credits=50)
    results = race(stores, lambda s, _: s.write(lambda tx: tx.spend_credits(payer, 1)), rounds=20)
    assert results.count(None) == 50
    assert all(isinstance(result, CreditExhausted) for result in results if result is not None)
    assert stores[0].reads.get_account(payer).credits == 0


def test_a_commit_reports_how_long_its_jobs_waited_and_how_long_it_held_the_store(stores):
    """``on_commit``: once a write commits, how long its job waited, and how long the
    transaction held what other writes wait for (the job's own time among it); a write that
    failed reports nothing."""
    store = stores[0]
    payer = account(store, credits=1)
    seen: list[tuple[int, float]] = []
    store.on_commit = lambda waits, held: seen.append((len(waits), held))

    def slow(tx: Any) -> None:
        time.sleep(0.03)
        tx.add_credits(payer, 1)

    store.write(slow)
    with pytest.raises(CreditExhausted):
        store.write(lambda tx: tx.spend_credits(payer, 10))
    [(jobs, held)] = seen
    assert jobs == 1 and 0.03 <= held < 5
    assert store.reads.get_account(payer).credits == 2


def test_jobs_of_one_batch_spend_an_account_s_credit_and_tokens_exactly(open_test_store):
    """Many threads of one store, so that its writer commits their jobs in batches (where the
    backend holds them back, a batch's debits of one account and takes of one bucket go as one
    statement): each job still gets its own outcome, and no credit or token is spent twice or
    lost."""
    store = open_test_store()
    payer = account(store, credits=50)
    batches: list[int] = []
    store.on_commit = lambda waits, held: batches.append(len(waits))

    def spend(tx: Any) -> None:
        tx.spend_credits(payer, 1)
        tx.spend_token(payer, "send", 60, 1000.0)

    results = race([store] * 16, lambda s, _: s.write(spend), rounds=6)
    assert results.count(None) == 50
    assert all(isinstance(result, CreditExhausted) for result in results if result is not None)
    assert store.reads.get_account(payer).credits == 0
    own, bucket = store.reads.get_bucket(payer, "send")
    assert bucket is not None and bucket[0] == pytest.approx(60 - 50)
    assert max(batches) > 1  # (batches were made)


def test_a_write_that_confirms_a_key_revoked_by_another_store_keeps_nothing(stores):
    owner = account(stores[0], credits=0)
    for key_id in ("key_live", "key_revoked"):
        stores[0].write(lambda tx, k=key_id: tx.create_api_key(k, owner, b"hash", "full", 0.0))
    stores[1].write(lambda tx: tx.revoke_api_key("key_revoked", 1.0))

    def confirmed(store: Store, number: int) -> Any:
        key_id = "key_revoked" if number % 2 else "key_live"

        def job(tx: Any) -> None:
            tx.confirm_key(key_id)
            tx.add_credits(owner, 1)

        return store.write(job)

    results = race(stores, confirmed, rounds=5)
    assert results.count(None) == RACERS // 2 * 5
    assert sum(isinstance(r, KeyRevoked) for r in results) == RACERS // 2 * 5
    assert stores[0].reads.get_account(owner).credits == RACERS // 2 * 5


def test_a_write_that_confirms_nobody_suppressed_is_refused_once_somebody_is(stores):
    owner = account(stores[0], credits=0)
    stores[0].write(lambda tx: tx.create_api_key("key_1", owner, b"hash", "full", 0.0))

    def job(tx: Any, nobody_suppressed: bool = True) -> None:
        tx.confirm_key("key_1", nobody_suppressed=nobody_suppressed)
        tx.add_credits(owner, 1)

    stores[0].write(job)
    stores[1].write(
        lambda tx: tx.add_suppression(owner, "gone@example.org", "manual", None, None, 2.0)
    )
    with pytest.raises(SuppressionsAdded):
        stores[0].write(job)
    stores[0].write(lambda tx: job(tx, nobody_suppressed=False))  # (the key is live)
    assert stores[0].reads.get_account(owner).credits == 2


def test_credit_added_concurrently_all_counts(stores):
    payer = account(stores[0], credits=0)
    race(stores, lambda s, _: s.write(lambda tx: tx.add_credits(payer, 3)), rounds=10)
    assert stores[0].reads.get_account(payer).credits == RACERS * 10 * 3


def test_a_rate_limit_is_counted_once_for_every_caller(stores):
    per_minute = 40
    results = race(
        stores,
        lambda s, _: s.write(lambda tx: tx.spend_token("acc_1", "send", per_minute, 1000.0)),
        rounds=10,
    )
    assert results.count(None) == per_minute
    assert all(isinstance(result, TokenExhausted) for result in results if result is not None)


def test_an_idempotency_key_is_claimed_once(stores):
    def claim(store: Store, number: int) -> Any:
        return store.write(
            lambda tx: tx.claim_idempotency(
                "acc_1", "order-1", "same-request", 1000.0, 0.0, 200, f'{{"by": {number}}}'
            )
        )

    results = race(stores, claim)
    claimed = [number for number, result in enumerate(results) if result is None]
    assert len(claimed) == 1
    held = {result.response_body for result in results if result is not None}
    assert len(held) == 1 and held == {
        stores[0].reads.get_idempotent("acc_1", "order-1", 0.0).response_body
    }


def test_an_expired_idempotency_key_is_claimed_again_once(stores):
    stores[0].write(lambda tx: tx.claim_idempotency("acc_1", "k", "old", 10.0, 0.0, 200, "{}"))
    results = race(
        stores,
        lambda s, n: s.write(
            lambda tx: tx.claim_idempotency("acc_1", "k", "new", 1000.0, 500.0, 201, str(n))
        ),
    )
    assert sum(1 for result in results if result is None) == 1
    assert stores[0].reads.get_idempotent("acc_1", "k", 500.0).fingerprint == "new"


def test_the_claims_purge_the_expired_answers_faster_than_they_add_answers(stores):
    """Without the hourly purge, one claim in PURGE_EVERY purges up to PURGE_AT_ONCE expired
    answers: the expired never pile up; the live are never touched."""
    store = stores[0]
    expired = 3 * idempotency.PURGE_AT_ONCE

    def old(tx):
        for n in range(expired):
            tx.claim_idempotency("acc_1", f"old-{n}", "f", 10.0, 0.0, 200, "{}")

    store.write(old)
    claims = 4 * idempotency.PURGE_EVERY
    for n in range(claims):
        request = idempotency.Claim("acc_1", f"new-{n}", "f", 1000.0, 500.0)
        assert store.write(lambda tx, r=request: idempotency.claim(tx, r, 200, "{}")) is None
    left = sum(
        store.reads.get_idempotent("acc_1", f"old-{n}", 0.0) is not None for n in range(expired)
    )
    assert left == 0  # four purges of up to 100 for the 300
    live = [store.reads.get_idempotent("acc_1", f"new-{n}", 500.0) for n in range(claims)]
    assert all(found is not None for found in live)


def test_due_mail_is_claimed_by_one_claimer_each(stores):
    owner = account(stores[0])
    key = new_signing_key(1024)
    stores[0].write(
        lambda tx: tx.add_domain("dom_1", owner, "verified.test", True, key, 0.0, "token")
    )

    def enqueue(tx: Any) -> None:
        for number in range(60):
            assert (
                tx.enqueue_email(
                    new_email(f"em_{number}", owner, "a@verified.test", created_at=100.0)
                )
                is not None
            )

    stores[0].write(enqueue)

    def claim_all(store: Store, number: int) -> list[str]:
        mine: list[str] = []
        while batch := store.write(lambda tx: tx.claim_due(f"claimer-{number}", 200.0, 60.0, 3)):
            mine.extend(email.id for email in batch)
        return mine

    claimed = Counter(email for batch in race(stores, claim_all) for email in batch)
    assert set(claimed) == {f"em_{number}" for number in range(60)}
    assert set(claimed.values()) == {1}, "an email was claimed twice"


def test_a_domain_is_verified_by_one_account_only(stores):
    key = new_signing_key(1024)
    names = [account(stores[0], name=f"acc_{n}") for n in range(RACERS)]

    def verify(store: Store, number: int) -> str:
        domain = store.write(
            lambda tx: tx.add_domain(
                f"dom_{number}", names[number], "one.test", False, key, 0.0, "t"
            )
        )
        store.write(lambda tx: tx.record_domain_check(domain.id, {}, 1.0, True))
        return names[number]

    results = race(stores, verify)
    winners = [result for result in results if isinstance(result, str)]
    assert len(winners) == 1
    assert all(isinstance(r, DomainTaken) for r in results if not isinstance(r, str))
    [verified] = [d for d in stores[0].reads.find_domains("one.test") if d.verified]
    assert verified.account_id == winners[0]


def test_an_account_adds_a_name_once(stores):
    owner = account(stores[0])
    key = new_signing_key(1024)
    results = race(
        stores,
        lambda s, n: s.write(
            lambda tx: tx.create_domain(f"dom_{n}", owner, "twice.test", key, 0.0, "t")
        ),
    )
    assert sum(1 for result in results if not isinstance(result, Exception)) == 1
    assert sum(1 for result in results if isinstance(result, DomainExists)) == RACERS - 1


def test_a_revoked_key_is_refused_by_every_store_at_once(stores):
    owner = account(stores[0])
    stores[0].write(lambda tx: tx.create_api_key("key_1", owner, b"hash", "full", 0.0))
    assert all(not store.reads.get_api_key("key_1").revoked for store in stores)
    stores[0].write(lambda tx: tx.revoke_api_key("key_1", 1.0))
    assert all(store.reads.get_api_key("key_1").revoked for store in stores)


def test_a_write_finds_a_key_revoked_by_another_store_before_it(stores):
    owner = account(stores[0])
    stores[0].write(lambda tx: tx.create_api_key("key_1", owner, b"hash", "full", 0.0))
    stores[0].write(lambda tx: tx.revoke_api_key("key_1", 1.0))
    assert all(store.write(lambda tx: tx.get_api_key("key_1")).revoked for store in stores)
    assert stores[1].write(lambda tx: tx.get_api_key("key_unknown")) is None


def test_every_process_gets_the_same_service_secret(stores):
    results = race(stores, lambda s, n: s.write(lambda tx: tx.service_secret("x", bytes([n]) * 16)))
    assert len(set(results)) == 1


def test_mail_is_queued_only_from_a_verified_domain_of_its_account(stores):
    owner, other = account(stores[0], name="acc_owner"), account(stores[0], name="acc_other")
    key = new_signing_key(1024)
    stores[0].write(lambda tx: tx.add_domain("dom_1", other, "theirs.test", True, key, 0.0, "t"))
    stores[0].write(lambda tx: tx.add_domain("dom_2", owner, "pending.test", False, key, 0.0, "t"))
    for sender in ("a@theirs.test", "a@pending.test", "a@nowhere.test"):
        email = new_email("em_x", owner, sender)
        assert stores[0].write(lambda tx, email=email: tx.enqueue_email(email)) is None
    assert stores[0].reads.count_emails_by_status() == {}


class Refused(Exception):
    pass


def test_an_email_queued_without_waiting_is_refused_whole_from_an_unverified_domain(stores):
    owner = account(stores[0], credits=10, name="acc_owner")
    sender_domain(stores[0], owner)
    key = new_signing_key(1024)
    stores[0].write(lambda tx: tx.add_domain("dom_2", owner, "pending.test", False, key, 0.0, "t"))
    files = (Attachment("a.txt", "text/plain", b"hello", None),)
    tags = (("flow", "reset"),)

    def accept(email: NewEmail) -> Callable[[Any], None]:
        def job(tx: Any) -> None:
            tx.enqueue_email_or_refuse(email, lambda: Refused(email.id))
            tx.spend_credits(owner, 1)

        return job

    # First in its process (and its connections' sessions): refused, nothing written.
    refused = new_email("em_refused", owner, "a@pending.test", attachments=files, tags=tags)
    with pytest.raises(Refused):
        stores[1].write(accept(refused))
    assert stores[0].reads.count_emails_by_status() == {}
    assert stores[0].reads.get_account(owner).credits == 10
    # Accepted ones hang their rows on their own row, however many came before on the session.
    for number in range(3):
        email = new_email(f"em_{number}", owner, "a@verified.test", attachments=files,
                          tags=(("n", str(number)),),
                          recipients=(NewRecipient(f"r{number}@example.org"),))  # fmt: skip
        stores[1].write(accept(email))
        with pytest.raises(Refused):  # refused after one that was accepted on the session
            stores[1].write(accept(refused))
    for number in range(3):
        stored = stores[2].reads.get_email(owner, f"em_{number}")
        assert [r.address for r in stored.recipients] == [f"r{number}@example.org"]
        assert stored.tags == (("n", str(number)),)
        assert [(a.filename, a.size) for a in stored.attachments] == [("a.txt", 5)]
        assert stores[2].reads.attachment_contents([stored.seq])[stored.seq] == list(files)
    assert stores[0].reads.count_emails_by_status() == {"queued": 3}
    assert stores[0].reads.get_account(owner).credits == 7


def test_everything_an_email_carries_comes_back_as_it_went_in(stores):
    store, owner = stores[0], account(stores[0])
    sender_domain(store, owner)
    content = bytes(range(256)) * 40  # every byte value, NULs included
    email = new_email(
        "em_full",
        owner,
        "a@verified.test",
        recipients=(
            NewRecipient("to@example.org", "to", "Tó Person"),
            NewRecipient("cc@example.org", "cc"),
            NewRecipient("bcc@example.org", "bcc", "Hidden"),
        ),
        reply_to=("Support <help@verified.test>", "b@verified.test"),
        headers=(("List-Unsubscribe", "<https://u.test/x>"), ("X-Campaign", "fall")),
        attachments=(
            Attachment("receipt.pdf", "application/pdf", content),
            Attachment("logo.png", "image/png", b"\x89PNG", "logo@x"),
        ),
        tags=(("kind", "receipt"), ("plan", "pro")),
        charged=3,
    )
    seq = store.write(lambda tx: tx.enqueue_email(email))
    shown = store.reads.get_email(owner, "em_full")
    assert [(r.address, r.kind, r.name) for r in shown.recipients] == [
        ("to@example.org", "to", "Tó Person"),
        ("cc@example.org", "cc", None),
        ("bcc@example.org", "bcc", "Hidden"),
    ]
    assert shown.reply_to == email.reply_to and shown.headers == email.headers
    assert shown.tags == email.tags and shown.charged == 3 and shown.status == "queued"
    assert [(a.filename, a.content_id, a.size) for a in shown.attachments] == [
        ("receipt.pdf", None, len(content)),
        ("logo.png", "logo@x", 4),
    ]
    files = store.write(lambda tx: tx.attachment_contents([seq]))[seq]
    assert files == list(email.attachments)
    tagged = store.reads.list_emails(owner, EmailFilter(tag=("plan", "pro")), None, 10)
    assert [found.id for found in tagged] == ["em_full"]
    assert store.reads.list_emails(owner, EmailFilter(tag=("plan", "free")), None, 10) == []


def test_a_scheduled_email_waits_for_its_time(stores):
    store, owner = stores[0], account(stores[0])
    sender_domain(store, owner)
    email = new_email("em_later", owner, "a@verified.test", scheduled_at=5000.0)
    store.write(lambda tx: tx.enqueue_email(email))
    assert store.reads.get_email(owner, "em_later").status == "scheduled"
    assert store.write(lambda tx: tx.next_due_at()) == 5000.0
    assert store.write(lambda tx: tx.claim_due("me", 4999.0, 60.0, 10)) == []
    assert store.write(lambda tx: tx.reschedule_email(owner, "em_later", 6000.0, 4999.0))
    assert store.write(lambda tx: tx.claim_due("me", 5500.0, 60.0, 10)) == []
    claimed = store.write(lambda tx: tx.claim_due("me", 6000.0, 60.0, 10))
    assert [found.id for found in claimed] == ["em_later"]
    assert not store.write(lambda tx: tx.reschedule_email(owner, "em_later", 7000.0, 6000.0))
    assert store.write(lambda tx: tx.cancel_email(owner, "em_later", 6000.0)) is None


def test_the_backlog_counts_what_is_due_up_to_its_least_and_names_the_newest_email(stores):
    store, owner = stores[0], account(stores[0])
    sender_domain(store, owner)
    assert store.reads.backlog(1000.0, 3) == (0, 0)
    emails = [new_email(f"em_{n}", owner, "a@verified.test") for n in range(5)]
    seqs = [store.write(lambda tx, e=e: tx.enqueue_email(e)) for e in emails]
    later = new_email("em_later", owner, "a@verified.test", scheduled_at=5000.0)
    newest = store.write(lambda tx: tx.enqueue_email(later))
    assert newest > max(seqs)
    assert store.reads.backlog(1000.0, 3) == (3, newest)  # counted no further than asked
    assert store.reads.backlog(1000.0, 100) == (5, newest)  # not the email due at 5000
    assert store.reads.backlog(5000.0, 100) == (6, newest)
    claimed = store.write(lambda tx: tx.claim_due("me", 1000.0, 60.0, 2))
    assert len(claimed) == 2
    assert store.reads.backlog(1000.0, 100) == (3, newest)  # leased: not due until it ends
    assert stores[1].reads.backlog(1000.0, 100) == (3, newest)  # (every process sees it)


def test_a_cancel_gives_the_credit_back_once(stores):
    store, owner = stores[0], account(stores[0], credits=10)
    sender_domain(store, owner)
    email = new_email("em_c", owner, "a@verified.test", scheduled_at=5000.0, charged=4)

    def queue(tx: Any) -> None:
        tx.enqueue_email(email)
        tx.spend_credits(owner, 4)

    store.write(queue)
    assert store.reads.get_account(owner).credits == 6
    assert store.write(lambda tx: tx.cancel_email("acc_other", "em_c", 10.0)) is None
    results = race(stores, lambda s, _: s.write(lambda tx: tx.cancel_email(owner, "em_c", 10.0)))
    assert sorted(results, key=lambda found: found is None) == [4] + [None] * (RACERS - 1)
    assert store.reads.get_account(owner).credits == 10
    shown = store.reads.get_email(owner, "em_c")
    assert shown.status == "canceled" and {r.status for r in shown.recipients} == {"canceled"}
    assert store.reads.email_events([shown.seq])[shown.seq][-1].type == "canceled"
    assert store.write(lambda tx: tx.claim_due("me", 9000.0, 60.0, 10)) == []


def test_a_cancel_and_a_claim_at_its_time_one_wins(stores):
    store, owner = stores[0], account(stores[0], credits=0)
    sender_domain(store, owner)
    rounds = 15
    for number in range(rounds):
        email = new_email(f"em_{number}", owner, "a@verified.test", scheduled_at=100.0, charged=1)
        store.write(lambda tx, email=email: tx.enqueue_email(email))

    def cancel_or_claim(s: Store, racer: int) -> Any:
        if racer % 2:
            return [
                ("claimed", e.id) for e in s.write(lambda tx: tx.claim_due("me", 100.0, 60.0, 1))
            ]
        outcomes = []
        for number in range(rounds):
            if s.write(lambda tx, n=number: tx.cancel_email(owner, f"em_{n}", 100.0)) is not None:
                outcomes.append(("canceled", f"em_{number}"))
        return outcomes

    results = race(stores, cancel_or_claim, rounds=rounds)
    outcomes = [outcome for result in results for outcome in result]
    by_email = Counter(email_id for _, email_id in outcomes)
    assert set(by_email) == {f"em_{number}" for number in range(rounds)}
    assert set(by_email.values()) == {1}, "an email was both canceled and claimed, or twice"
    canceled = sum(1 for kind, _ in outcomes if kind == "canceled")
    assert store.reads.get_account(owner).credits == canceled


# -- after the handoff: reports, suppressions, webhooks ---------------------------------------


def test_a_report_is_used_once(stores):
    results = race(stores, lambda s, n: s.write(lambda tx: tx.claim_report("mid:<r1@mx>", 1.0)))
    assert results.count(True) == 1 and results.count(False) == RACERS - 1


def test_an_address_is_suppressed_once(stores):
    owner = account(stores[0])
    results = race(
        stores,
        lambda s, n: s.write(
            lambda tx: tx.add_suppression(
                owner, "Alice@example.org", "bounced", f"em_{n}", None, 1.0
            )
        ),
    )
    assert results.count(True) == 1
    [kept] = stores[0].reads.list_suppressions(owner, None, None, 10)
    assert kept.address == "alice@example.org"
    assert stores[0].reads.suppressed(owner, ["ALICE@example.org"])["ALICE@example.org"] == kept


def test_what_delivery_needs_is_read_at_once_for_several_accounts(stores):
    """The sending context of a claim of two accounts' emails: each account's subscribed event
    types (an account with none: empty), the recipients each suppresses (matched in any case,
    answered as asked, never another account's), and each sender domain's DKIM key (None for
    a domain that is not verified, or not the account's)."""
    from mailsvc.store import SigningKey, Webhook

    store = stores[0]
    hooked, plain = account(store, name="acc_hooked"), account(store, name="acc_plain")
    sender_domain(store, hooked, "hooked.test")
    sender_domain(store, plain, "plain.test")
    key = new_signing_key(1024)
    store.write(lambda tx: tx.add_domain("dom_u", plain, "unverified.test", False, key, 0.0, "t"))
    for n, (status, events) in enumerate(
        [("enabled", ("email.sent", "email.bounced")), ("disabled", ("email.opened",))]
    ):
        hook = Webhook(f"wh_ctx{n}", hooked, f"https://h{n}.test/", events, status, None,
                       b"sealed", None, None, 0.0, 0.0)  # fmt: skip
        store.write(lambda tx, hook=hook: tx.create_webhook(hook))
    for owner, address in ((hooked, "Gone@example.org"), (plain, "left@example.org")):
        store.write(
            lambda tx, o=owner, a=address: tx.add_suppression(o, a, "manual", None, None, 1.0)
        )
    context = store.reads.sending_context(
        {hooked: ["GONE@example.org", "left@example.org"], plain: ["left@example.org"]},
        [(hooked, "hooked.test"), (plain, "plain.test"), (plain, "unverified.test"),
         (plain, "hooked.test")],
    )  # fmt: skip
    assert context.subscribed == {hooked: {"email.sent", "email.bounced"}, plain: frozenset()}
    assert list(context.suppressed[hooked]) == ["GONE@example.org"]
    assert context.suppressed[hooked]["GONE@example.org"].address == "gone@example.org"
    assert list(context.suppressed[plain]) == ["left@example.org"]
    assert isinstance(context.keys[(hooked, "hooked.test")], SigningKey)
    assert context.keys[(plain, "plain.test")] != context.keys[(hooked, "hooked.test")]
    assert context.keys[(plain, "unverified.test")] is None
    assert context.keys[(plain, "hooked.test")] is None
    assert store.reads.sending_context({}, []) == type(context)({}, {}, {})


def test_a_claim_to_send_holds_the_emails_and_what_sending_them_needs(stores):
    """What a delivery thread claims on either backend: the emails as :meth:`claim_due` leases
    them, with their recipients, tags and attachments, and the sending context of exactly
    those emails: each account's subscribed event types, the suppressed recipients among those
    that wait for an attempt (as the email has them), and each sender domain's DKIM key (None
    for one without)."""
    from mailsvc.store import Attachment, NewRecipient, SigningKey, Webhook

    store = stores[0]
    hooked, plain = account(store, name="acc_hooked"), account(store, name="acc_plain")
    sender_domain(store, hooked, "hooked.test")
    hook = Webhook("wh_claim", hooked, "https://h.test/", ("email.sent",), "enabled", None,
                   b"sealed", None, None, 0.0, 0.0)  # fmt: skip
    store.write(lambda tx: tx.create_webhook(hook))
    for owner, address in ((hooked, "gone@example.org"), (hooked, "held@example.org")):
        store.write(
            lambda tx, o=owner, a=address: tx.add_suppression(o, a, "manual", None, None, 1.0)
        )
    first = new_email(
        "em_first",
        hooked,
        "a@hooked.test",
        recipients=(
            NewRecipient("Gone@Example.org", "to", "Gone"),
            NewRecipient("keep@example.org", "cc"),
            NewRecipient("held@example.org", "bcc", None, "suppressed", "held at accept"),
        ),
        tags=(("kind", "receipt"), ("plan", "pro")),
        attachments=(Attachment("a.txt", "text/plain", b"hello"),),
    )
    sender_domain(store, plain, "deleted.test")  # deleted once its email is queued
    second = new_email(
        "em_second", plain, "b@deleted.test", 2.0,
        recipients=(NewRecipient("gone@example.org"),),
    )  # fmt: skip
    for email in (first, second):
        store.write(lambda tx, email=email: tx.enqueue_email(email))
    assert store.write(lambda tx: tx.delete_domain(plain, "dom_deleted.test"))
    emails, context = store.write(lambda tx: tx.claim_to_send("me", 100.0, 60.0, 10))
    assert sorted(e.id for e in emails) == ["em_first", "em_second"]
    got = {e.id: e for e in emails}["em_first"]
    assert got == store.reads.get_email(hooked, "em_first")
    assert [(r.address, r.kind, r.name, r.status) for r in got.recipients] == [
        ("Gone@Example.org", "to", "Gone", "queued"),
        ("keep@example.org", "cc", None, "queued"),
        ("held@example.org", "bcc", None, "suppressed"),
    ]
    assert got.tags == (("kind", "receipt"), ("plan", "pro"))
    assert [(a.filename, a.size) for a in got.attachments] == [("a.txt", 5)]
    assert (got.status, got.attempts, got.due_at) == ("sending", 1, 160.0)
    assert context.subscribed == {hooked: {"email.sent"}, plain: frozenset()}
    assert list(context.suppressed[hooked]) == ["Gone@Example.org"]
    assert context.suppressed[hooked]["Gone@Example.org"].address == "gone@example.org"
    assert context.suppressed[plain] == {}
    assert isinstance(context.keys[(hooked, "hooked.test")], SigningKey)
    assert context.keys[(plain, "deleted.test")] is None
    assert store.write(lambda tx: tx.claim_to_send("other", 100.0, 60.0, 10)) == (
        [],
        type(context)({}, {}, {}),
    )


def hooked_account(store: Store, endpoints: int = 4) -> str:
    from mailsvc.store import Webhook

    owner = account(store)
    for n in range(endpoints):
        hook = Webhook(f"wh_{n}", owner, f"https://h{n}.test/", ("email.sent",), "enabled", None,
                       b"sealed", None, None, 0.0, 0.0)  # fmt: skip
        store.write(lambda tx, hook=hook: tx.create_webhook(hook))
    return owner


def test_webhook_deliveries_are_claimed_by_one_claimer_each(stores):
    from mailsvc.store import WebhookEvent

    owner = hooked_account(stores[0])
    events = [WebhookEvent(f"msg_{n}", "email.sent", "{}") for n in range(15)]
    stores[0].write(lambda tx: tx.add_webhook_events(owner, None, events, 100.0))

    def claim_all(store: Store, number: int) -> list[tuple[str, str]]:
        mine: list[tuple[str, str]] = []
        while batch := store.write(
            lambda tx: tx.claim_webhook_deliveries(f"claimer-{number}", 200.0, 60.0, 3, 100)
        ):
            mine.extend((delivery.event_id, delivery.webhook_id) for delivery, _ in batch)
        return mine

    claimed = Counter(pair for batch in race(stores, claim_all) for pair in batch)
    assert len(claimed) == 15 * 4  # every event, to every endpoint
    assert set(claimed.values()) == {1}, "a delivery was claimed twice"


def test_events_of_one_email_go_to_an_endpoint_one_after_the_other(stores):
    from mailsvc.store import WebhookAttempt, WebhookEvent

    store = stores[0]
    owner = hooked_account(store, endpoints=1)
    first, second = (
        WebhookEvent("msg_1", "email.sent", "{}"),
        WebhookEvent("msg_2", "email.sent", "{}"),
    )
    store.write(lambda tx: tx.add_webhook_events(owner, 7, [first, second], 100.0))
    [(claimed, _)] = store.write(lambda tx: tx.claim_webhook_deliveries("a", 101.0, 60.0, 5, 5))
    assert claimed.event_id == "msg_1"  # the second waits for the first
    assert store.write(lambda tx: tx.claim_webhook_deliveries("b", 101.0, 60.0, 5, 5)) == []
    attempt = WebhookAttempt(1, 101.0, 200, 3.0, None)
    store.write(lambda tx: tx.finish_webhook_delivery(claimed.seq, "a", attempt, "succeeded", None))
    [(then, _)] = store.write(lambda tx: tx.claim_webhook_deliveries("b", 102.0, 60.0, 5, 5))
    assert then.event_id == "msg_2"


def test_a_finished_webhook_delivery_is_sent_again_once_by_every_store_at_once(stores):
    from mailsvc.store import WebhookAttempt, WebhookEvent

    store = stores[0]
    owner = hooked_account(store, endpoints=1)
    store.write(
        lambda tx: tx.add_webhook_events(owner, 7, [WebhookEvent("msg_1", "email.sent", "{}")], 1.0)
    )
    [(claimed, _)] = store.write(lambda tx: tx.claim_webhook_deliveries("a", 2.0, 60.0, 5, 5))
    assert not store.write(lambda tx: tx.resend_webhook_delivery(owner, "wh_0", "msg_1", 3.0))
    attempt = WebhookAttempt(1, 2.0, 500, 3.0, None)
    store.write(lambda tx: tx.finish_webhook_delivery(claimed.seq, "a", attempt, "failed", None))
    store.write(lambda tx: tx.hold_endpoint("wh_0", 5000.0))

    def resend(s: Store, _: int) -> bool:
        return s.write(lambda tx: tx.resend_webhook_delivery(owner, "wh_0", "msg_1", 10.0))

    assert sorted(race(stores, resend)) == [False] * (RACERS - 1) + [True]
    again = stores[1].reads.get_webhook_delivery(owner, "wh_0", "msg_1")
    assert (again.status, again.due_at, len(again.tried)) == ("pending", 10.0, 1)
    # Due now, though the endpoint was held after its failures; another account's is untouched.
    [(taken, _)] = store.write(lambda tx: tx.claim_webhook_deliveries("b", 11.0, 60.0, 5, 5))
    assert taken.seq == claimed.seq and taken.attempts == 2
    assert not store.write(lambda tx: tx.resend_webhook_delivery("acc_x", "wh_0", "msg_1", 12.0))
    assert stores[2].reads.get_webhook_delivery("acc_x", "wh_0", "msg_1") is None


def test_leases_that_ran_out_during_an_outage_are_left_to_their_holders(stores):
    store, owner = stores[0], account(stores[0])
    sender_domain(store, owner)
    emails = [new_email(f"em_{n}", owner, "a@verified.test", created_at=100.0) for n in range(3)]
    store.write(lambda tx: tx.enqueue_emails(emails))
    held = store.write(lambda tx: tx.claim_due("holder", 100.0, 10.0, 2))  # leases end at 110
    assert len(held) == 2
    # Claimed at 200 (all leases ran out): leases that ran out from 105 on are left alone...
    after = stores[1].write(lambda tx: tx.claim_due("other", 200.0, 10.0, 10, 105.0))
    assert [e.id for e in after] == ["em_2"]
    # ... those that ran out before are taken, as every one is without a cutoff.
    assert stores[2].write(lambda tx: tx.claim_due("other", 200.0, 10.0, 10, 111.0)) != []


def test_webhook_leases_that_ran_out_during_an_outage_are_left_to_their_holders(stores):
    from mailsvc.store import WebhookEvent

    store = stores[0]
    owner = hooked_account(store, endpoints=2)
    events = [WebhookEvent(f"msg_{n}", "email.sent", "{}") for n in range(2)]
    store.write(lambda tx: tx.add_webhook_events(owner, None, events[:1], 100.0))
    held = store.write(lambda tx: tx.claim_webhook_deliveries("holder", 100.0, 10.0, 10, 5))
    assert len(held) == 2  # one event, two endpoints: leases end at 110
    store.write(lambda tx: tx.add_webhook_events(owner, None, events[1:], 150.0))
    after = stores[1].write(lambda tx: tx.claim_webhook_deliveries("b", 200.0, 10.0, 10, 5, 105.0))
    assert {d.event_id for d, _ in after} == {"msg_1"}
    taken = stores[2].write(lambda tx: tx.claim_webhook_deliveries("c", 200.0, 10.0, 10, 5, 111.0))
    assert {d.event_id for d, _ in taken} == {"msg_0"}


def test_an_owners_leases_are_listed_by_every_store_and_given_back_once(stores):
    """After an outage, a process lists its leases (those of its claims whose answers were
    lost among them) and gives back those it does not hold: a finished email is no lease."""
    from mailsvc.store import WebhookEvent

    store = stores[0]
    owner = hooked_account(store, endpoints=2)
    sender_domain(store, owner)
    emails = [new_email(f"em_{n}", owner, "a@verified.test", created_at=100.0) for n in range(3)]
    store.write(lambda tx: tx.enqueue_emails(emails))
    held = store.write(lambda tx: tx.claim_due("me", 100.0, 60.0, 2))
    store.write(lambda tx: tx.claim_due("other", 100.0, 60.0, 1))
    seqs = sorted(email.seq for email in held)
    assert [s.write(lambda tx: tx.email_leases("me")) for s in stores] == [seqs] * len(stores)
    given = [s.write(lambda tx: tx.release_claims("me", seqs[1:], 120.0)) for s in stores]
    assert sorted(given, reverse=True) == [1] + [0] * (len(stores) - 1)
    assert stores[1].write(lambda tx: tx.email_leases("me")) == seqs[:1]
    assert stores[2].write(lambda tx: tx.email_leases("nobody")) == []

    event = WebhookEvent("msg_m", "email.sent", "{}")
    store.write(lambda tx: tx.add_webhook_events(owner, None, [event], 100.0))
    leased = store.write(lambda tx: tx.claim_webhook_deliveries("me", 100.0, 60.0, 10, 5))
    leased_seqs = sorted(delivery.seq for delivery, _ in leased)
    assert len(leased_seqs) == 2
    assert stores[1].write(lambda tx: tx.webhook_delivery_leases("me")) == leased_seqs
    stores[2].write(lambda tx: tx.release_webhook_claims("me", leased_seqs[:1], 120.0))
    assert store.write(lambda tx: tx.webhook_delivery_leases("me")) == leased_seqs[1:]


def test_a_large_body_comes_back_whole_and_on_sqlite_is_kept_apart(stores, backend):
    """On SQLite a body over the dialect's inline_body_chars is written once, in
    ``email_bodies``, not in the email's row (which every claim and outcome rewrites whole
    there); PostgreSQL keeps every body in its row (out of line, TOASTed). Every way an email
    is read back gives it whole, whichever verb queued it."""
    store = stores[0]
    owner = account(store, credits=10)
    sender_domain(store, owner)
    html = "<p>" + "é" * SQLITE.inline_body_chars + "</p>"
    text = "t" * 10
    alone = replace(new_email("em_alone", owner, "a@verified.test"), html=html, text=text)
    waiting = replace(new_email("em_waiting", owner, "a@verified.test"), html=html, text=None)
    batch = [
        replace(new_email("em_batch_large", owner, "a@verified.test"), text=html),
        replace(new_email("em_batch_small", owner, "a@verified.test"), html="<p>small</p>"),
    ]
    store.write(lambda tx: tx.enqueue_email(alone))
    store.write(lambda tx: tx.enqueue_email_or_refuse(waiting, RuntimeError))
    store.write(lambda tx: tx.enqueue_emails(batch))
    expected = {
        "em_alone": (html, text),
        "em_waiting": (html, None),
        "em_batch_large": (None, html),
        "em_batch_small": ("<p>small</p>", "t"),
    }
    for email_id, bodies in expected.items():
        shown = store.reads.get_email(owner, email_id)
        assert (shown.html, shown.text) == bodies, email_id
    listed = store.reads.list_emails(owner, EmailFilter(), None, 10)
    assert {found.id: (found.html, found.text) for found in listed} == expected
    claimed, _ = store.write(lambda tx: tx.claim_to_send("claimer", 2.0, 60.0, 10))
    apart_ids = {"em_alone", "em_waiting", "em_batch_large"} if backend == "sqlite" else set()
    assert {found.id: (found.html, found.text) for found in claimed} == {
        email_id: (None, None) if email_id in apart_ids else bodies
        for email_id, bodies in expected.items()
    }  # (a claim does not read a body kept apart under the write lock)
    assert {
        found.id: store.reads.email_body(found.seq) for found in claimed if found.id in apart_ids
    } == {email_id: expected[email_id] for email_id in apart_ids}
    with store.read() as view:
        rows = view.connection.execute(  # type: ignore[attr-defined]
            "SELECT emails.id, emails.html IS NULL AND emails.text IS NULL, "
            "email_bodies.email_seq IS NOT NULL FROM emails "
            "LEFT JOIN email_bodies ON email_bodies.email_seq = emails.seq"
        ).fetchall()
    apart = {email_id: bool(empty) and bool(kept) for email_id, empty, kept in rows}
    large = backend == "sqlite"
    assert apart == {
        "em_alone": large,
        "em_waiting": large,
        "em_batch_large": large,
        "em_batch_small": False,
    }


def test_a_batch_is_queued_whole_with_everything_each_email_holds(stores):
    store = stores[0]
    owner = account(store)
    sender_domain(store, owner)
    many = tuple(NewRecipient(f"r{n}@example.org", "cc" if n % 2 else "to") for n in range(50))
    batch = [
        new_email(f"em_{n}", owner, "a@verified.test", recipients=many, tags=(("n", str(n)),))
        for n in range(100)  # 5,000 recipients: more parameters than one statement may have
    ] + [new_email("em_elsewhere", owner, "a@unverified.test")]
    seqs = store.write(lambda tx: tx.enqueue_emails(batch))
    assert seqs[-1] is None and all(isinstance(seq, int) for seq in seqs[:-1])
    assert len(set(seqs[:-1])) == 100
    assert store.reads.get_email(owner, "em_elsewhere") is None
    found = store.reads.get_email(owner, "em_57")
    assert found.seq == seqs[57] and [r.address for r in found.recipients] == [
        r.address for r in many
    ]
    assert [r.kind for r in found.recipients][:2] == ["to", "cc"] and found.tags == (("n", "57"),)


def test_emails_waiting_for_the_relay_are_made_due_once(stores):
    store, owner = stores[0], account(stores[0])
    sender_domain(store, owner)
    waiting = [f"em_{number}" for number in range(30)]
    others = ["em_refused", "em_soon", "em_leased", "em_given_up"]

    def enqueue(tx: Any) -> None:
        for email_id in waiting + others:
            tx.enqueue_email(new_email(email_id, owner, "a@verified.test", created_at=100.0))

    store.write(enqueue)
    seqs = {e.id: e for e in store.write(lambda tx: tx.claim_due("me", 200.0, 60.0, 100))}
    assert len(seqs) == 34
    outcomes = {email_id: ("deferred", 3800.0, True) for email_id in waiting} | {
        "em_refused": ("deferred", 3800.0, False),  # the relay answered 4xx: its retry stands
        "em_soon": ("deferred", 250.0, True),  # due before the relay is back: stays so
        "em_leased": ("deferred", 210.0, True),  # leased again when the relay is back
        "em_given_up": ("failed", None, True),  # final: waits for nothing
    }

    def finish(tx: Any) -> None:
        for email_id, (status, due_at, unreached) in outcomes.items():
            tx.finish_attempt(
                seqs[email_id], "me", status, [], 200.0, due_at, "refused", 0, unreached
            )

    store.write(finish)
    [leased] = store.write(lambda tx: tx.claim_due("me", 215.0, 60.0, 100))
    assert leased.id == "em_leased"

    def due_again(s: Store, _: int) -> int:
        total = 0
        while (made := s.write(lambda tx: tx.due_again_after_outage(300.0, 4))) == 4:
            total += made
        return total + made

    assert sum(race(stores, due_again)) == 31, "an email made due twice, or left waiting"
    due = {email_id: store.reads.get_email(owner, email_id).due_at for email_id in seqs}
    assert {due[email_id] for email_id in waiting} == {300.0}
    assert (due["em_refused"], due["em_soon"], due["em_given_up"]) == (3800.0, 250.0, None)
    assert store.reads.get_email(owner, "em_leased").status == "sending"
    assert store.write(lambda tx: tx.due_again_after_outage(300.0, 100)) == 0
    # Its attempt did not reach the relay either: it waits, and goes at the next end of one.
    store.write(
        lambda tx: tx.finish_attempt(leased, "me", "deferred", [], 220.0, 900.0, "refused", 0, True)
    )
    assert store.write(lambda tx: tx.due_again_after_outage(400.0, 100)) == 1
    assert store.reads.get_email(owner, "em_leased").due_at == 400.0
    assert store.write(lambda tx: tx.claim_due("me", 300.0, 60.0, 100)) != []


class _CountedStatements:
    """A store connection's stand-in that counts the statements sent through it."""

    def __init__(self, connection: Any) -> None:
        self.connection, self.sent = connection, 0

    def execute(self, *arguments: Any) -> Any:
        self.sent += 1
        return self.connection.execute(*arguments)

    def queue(self, *arguments: Any) -> None:
        self.sent += 1
        self.connection.queue(*arguments)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)


def _record_counted(tx: Any, owner: str, attempts: list[Attempted]) -> int:
    """Record the attempts in the job's transaction; how many statements that took."""
    counted = tx.connection = _CountedStatements(tx.connection)
    try:
        tx.finish_attempts(owner, attempts)
    finally:
        tx.connection = counted.connection
    return counted.sent


def test_a_run_of_outcomes_is_recorded_as_each_alone_would_be(stores):
    """A delivery thread records a run of attempts in one call: the emails, their recipients,
    their events, their credit and their day's counts are what recording each alone gives,
    in as many statements for eight as for one. One lease lost refuses the whole run."""
    store = stores[0]
    owner = account(store, credits=100)
    sender_domain(store, owner)
    two = (NewRecipient("b@example.org"), NewRecipient("c@example.org", kind="cc"))
    store.write(
        lambda tx: [
            tx.enqueue_email(
                new_email(f"em_{n}", owner, "a@verified.test", recipients=two, charged=2)
            )
            for n in range(16)
        ]
    )
    claimed = {e.id: e for e in store.write(lambda tx: tx.claim_due("me", 9.0, 1e9, 16))}
    day = 86400.0
    sent = Recipient("b@example.org", "sent", 250, "2.0.0", "ok", "to")
    later = Recipient("c@example.org", "deferred", 451, "4.3.0", "try later", "cc")
    bounced = Recipient("c@example.org", "failed", 550, "5.1.1", "no such user", "cc")
    gone = Recipient("c@example.org", "suppressed", None, None, "on the list", "cc")
    kinds = [
        ("sent", ((0, sent), (1, replace(sent, address="c@example.org", kind="cc"))), None, 0),
        ("partially_sent", ((0, sent), (1, bounced)), None, 0),
        ("deferred", ((0, later),), 5 * day, 0),
        ("failed", ((0, replace(bounced, address="b@example.org")), (1, bounced)), None, 0),
        ("sent", ((0, sent), (1, gone)), None, 1),
        ("deferred", (), 3 * day, 0),  # the relay never answered: it waits for the relay
        ("sent", ((0, sent),), None, 0),
        ("failed", ((1, bounced),), None, 0),
    ]

    def attempts(first: int) -> list[Attempted]:
        return [
            Attempted(
                claimed[f"em_{first + n}"], status, recipients, 2.5 * day, due_at,
                None if status == "sent" else "why", refunded, relay_unreached=not recipients,
            )
            for n, (status, recipients, due_at, refunded) in enumerate(kinds)
        ]  # fmt: skip

    store.write(lambda tx: tx.finish_attempts("me", attempts(0)))
    for attempt in attempts(8):
        store.write(lambda tx, a=attempt: tx.finish_attempts("me", [a]))
    reads = store.reads
    for n in range(8):
        run, one = reads.get_email(owner, f"em_{n}"), reads.get_email(owner, f"em_{n + 8}")
        assert run.status == one.status == kinds[n][0]
        assert (run.due_at, run.sent_at, run.last_error, run.charged, run.attempts) == (
            one.due_at, one.sent_at, one.last_error, one.charged, one.attempts
        )  # fmt: skip
        assert run.recipients == one.recipients
        assert run.recipients[1].kind == "cc" and run.recipients[1].address == "c@example.org"
        events = reads.email_events([run.seq, one.seq])
        assert [(e.type, e.detail) for e in events[run.seq]] == [
            (e.type, e.detail) for e in events[one.seq]
        ]
    assert reads.get_email(owner, "em_0").sent_at == 2.5 * day
    assert reads.get_email(owner, "em_2").sent_at is None
    assert reads.get_email(owner, "em_4").charged == 1
    assert reads.get_account(owner).credits == 100 + 2  # two refunds, one each
    assert reads.daily_outcomes(owner, 0.0, 3)[2] == {"sent": 8, "failed": 4}  # partly: sent
    # The relay never answered the sixth: it waits for the relay, and its twin too.
    assert store.write(lambda tx: tx.due_again_after_outage(4 * day, 100)) == 2
    # Statements: on PostgreSQL, as many for a run of eight as for one (each is work for the
    # server); on SQLite, the emails' and their recipients' a row each (a join costs more
    # there), the run's events and its counts in one each.
    store.write(
        lambda tx: [
            tx.enqueue_email(new_email(f"em_more_{n}", owner, "a@verified.test")) for n in range(9)
        ]
    )
    more = store.write(lambda tx: tx.claim_due("me", 6 * day, 1e9, 9))
    assert {e.id for e in more} == {f"em_more_{n}" for n in range(9)}
    sent_each = [Attempted(e, "sent", ((0, sent),), 6 * day, None, None) for e in more]
    ran = [
        store.write(lambda tx, r=r: _record_counted(tx, "me", r))
        for r in (sent_each[:8], sent_each[8:])
    ]
    if store.backend == "postgresql":
        assert ran[0] == ran[1] <= 4, f"a run of 8 took {ran[0]} statements; of one, {ran[1]}"
    else:
        assert ran[0] - 2 == 8 * (ran[1] - 2), f"a run of 8: {ran[0]} statements; one: {ran[1]}"
    assert reads.daily_outcomes(owner, 6 * day, 1) == [{"sent": 9}]
    # Again, but one of the run's leases was taken over: nothing of the run is kept.
    mine = {}
    for email_id, lease in (("em_taken", 60.0), ("em_late", 1e9)):
        store.write(lambda tx, i=email_id: tx.enqueue_email(new_email(i, owner, "a@verified.test")))
        [mine[email_id]] = store.write(lambda tx, s=lease: tx.claim_due("me", 10 * day, s, 1))
    taken = store.write(lambda tx: tx.claim_due("other", 10 * day + 61, 60.0, 100))
    assert "em_taken" in {e.id for e in taken} and "em_late" not in {e.id for e in taken}
    run = [Attempted(mine[i], "sent", ((0, sent),), 10 * day, None, None) for i in sorted(mine)]
    with pytest.raises(LeaseLost) as lost:
        store.write(lambda tx: tx.finish_attempts("me", run))
    assert "em_taken" in lost.value.email_ids  # (on PostgreSQL, with the run's others)
    assert {reads.get_email(owner, i).status for i in mine} == {"sending"}
    assert reads.get_email(owner, "em_late").due_at == 10 * day + 1e9  # still its lease
    assert reads.daily_outcomes(owner, 9 * day, 2)[1] == {}


def test_charges_to_a_bucket_all_count_and_leave_it_below_empty_only_where_owed(stores):
    account(stores[0], name="acc_1")
    race(
        stores,
        lambda s, _: s.write(lambda tx: tx.charge_bucket("acc_1", "cpu", 2.5, 1000, 500.0)),
        rounds=10,
    )
    assert stores[0].reads.get_bucket("acc_1", "cpu") == (None, (1000 - RACERS * 10 * 2.5, 500.0))
    # Six seconds refill 100 (1000 a minute): 900 left, and a charge of 950 leaves it empty.
    stores[1].write(lambda tx: tx.charge_bucket("acc_1", "cpu", 950.0, 1000, 506.0))
    assert stores[0].reads.get_bucket("acc_1", "cpu") == (None, (0.0, 506.0))
    stores[1].write(lambda tx: tx.set_rate_limit("acc_1", "cpu", 3000))
    assert stores[0].reads.get_bucket("acc_1", "cpu")[0] == 3000
    assert stores[0].reads.get_bucket("acc_2", "cpu") == (None, None)  # never used: full
    # The template CPU bucket is owed what was spent beyond it, a minute's worth at most, and
    # refills from there; a request's token never is (the CHECK refuses it).
    owed = TEMPLATE_CPU_GROUP
    race(
        stores,
        lambda s, _: s.write(lambda tx: tx.charge_bucket("acc_1", owed, 100.0, 1000, 600.0)),
        rounds=1,
    )
    assert stores[0].reads.get_bucket("acc_1", owed) == (None, (1000 - RACERS * 100.0, 600.0))
    stores[1].write(lambda tx: tx.charge_bucket("acc_1", owed, 5000.0, 1000, 600.0))
    assert stores[0].reads.get_bucket("acc_1", owed) == (None, (-1000.0, 600.0))
    _, bucket = stores[0].reads.get_bucket("acc_1", owed)
    assert tokens_at(bucket, 1000, 630.0) == -500.0
    stores[1].write(lambda tx: tx.charge_bucket("acc_1", owed, 100.0, 1000, 630.0))
    assert stores[0].reads.get_bucket("acc_1", owed) == (None, (-600.0, 630.0))


def test_a_dashboard_session_is_seen_by_every_store_and_ends_everywhere_at_once(stores):
    owner = account(stores[0])
    stores[0].write(lambda tx: tx.create_api_key("key_1", owner, b"hash", "full", 0.0))
    for n in (1, 2, 3):
        stores[n % 2].write(
            lambda tx, n=n: tx.open_dashboard_session(bytes([n]) * 32, owner, "key_1", 10.0, 60)
        )
    seen = [store.reads.get_dashboard_session(b"\x01" * 32) for store in stores]
    assert all(s is not None and (s.account_id, s.key_id) == (owner, "key_1") for s in seen)
    # Sign-out ends the session on every host: one of two racing ends finds it.
    ended = race(stores, lambda s, n: s.write(lambda tx: tx.end_dashboard_session(b"\x01" * 32)))
    assert sorted(ended) == [False] * (RACERS - 1) + [True]
    assert all(store.reads.get_dashboard_session(b"\x01" * 32) is None for store in stores)
    # Revoking the key ends every session it opened, on every host.
    stores[1].write(lambda tx: tx.revoke_api_key("key_1", 20.0))
    for store in stores:
        assert store.reads.get_dashboard_session(b"\x02" * 32) is None
        assert store.reads.get_dashboard_session(b"\x03" * 32) is None


def test_a_dashboard_session_is_seen_at_most_every_30_seconds_and_idle_ones_go(stores):
    owner = account(stores[0])
    stores[0].write(lambda tx: tx.create_api_key("key_1", owner, b"hash", "full", 0.0))
    stores[0].write(lambda tx: tx.open_dashboard_session(b"a" * 32, owner, "key_1", 100.0, 60))
    stores[1].write(lambda tx: tx.see_dashboard_session(b"a" * 32, 110.0))
    assert stores[2].reads.get_dashboard_session(b"a" * 32).seen_at == 100.0  # (< 30 s)
    stores[1].write(lambda tx: tx.see_dashboard_session(b"a" * 32, 140.0))
    assert stores[2].reads.get_dashboard_session(b"a" * 32).seen_at == 140.0
    # A new session of the account's clears those idle for longer than the idle lifetime.
    stores[0].write(lambda tx: tx.open_dashboard_session(b"b" * 32, owner, "key_1", 300.0, 60))
    assert stores[3].reads.get_dashboard_session(b"a" * 32) is None
    assert stores[3].reads.get_dashboard_session(b"b" * 32) is not None


def test_an_accounts_daily_outcomes_are_counted_once_by_every_store_on_the_day_they_happen(
    stores,
):
    owner, other = account(stores[0], credits=1000), account(stores[0], 1000, name="acc_other")
    sender_domain(stores[0], owner)
    sender_domain(stores[0], other, "other.test")
    day = 86400.0
    two = (NewRecipient("b@example.org"), NewRecipient("c@example.org"))

    def enqueue(tx: Any) -> None:
        for number in range(80):
            tx.enqueue_email(new_email(f"em_{number}", owner, "a@verified.test", recipients=two))
        tx.enqueue_email(new_email("em_other", other, "a@other.test"))

    stores[0].write(enqueue)
    claimed = {e.id: e for e in stores[0].write(lambda tx: tx.claim_due("me", 9.0, 1e9, 100))}
    # Eight stores record at once: 40 sent (10 partly) on day 2, 20 failed on day 3, 20
    # deferred (not an outcome yet); another account's sent email; a lost lease counts nothing.
    plan = {f"em_{n}": ("sent", 2.5) for n in range(30)}
    plan |= {f"em_{n}": ("partially_sent", 2.6) for n in range(30, 40)}
    plan |= {f"em_{n}": ("failed", 3.5) for n in range(40, 60)}
    plan |= {f"em_{n}": ("deferred", 3.5) for n in range(60, 80)}

    delivered = [(0, Recipient("b@example.org", "sent")), (1, Recipient("c@example.org", "sent"))]

    def record(store: Store, number: int) -> list[None]:
        mine = sorted(plan)[number::RACERS]
        return [
            store.write(
                lambda tx, email_id=email_id: tx.finish_attempt(
                    claimed[email_id], "me", plan[email_id][0], delivered, plan[email_id][1] * day,
                    day * 9 if plan[email_id][0] == "deferred" else None, None,
                )
            )
            for email_id in mine
        ]  # fmt: skip

    race(stores, record)
    stores[0].write(
        lambda tx: tx.finish_attempt(claimed["em_other"], "me", "sent", [], 2.5 * day, None, None)
    )
    with pytest.raises(LeaseLost):
        stores[0].write(
            lambda tx: tx.finish_attempt(
                claimed["em_0"], "nobody", "sent", [], 2.5 * day, None, None
            )
        )
    # Reports of day 4: each of eight stores reports the same recipients; each counts once.
    reports = [("em_0", 0, "bounced"), ("em_0", 1, "bounced"), ("em_1", 0, "complained")]

    def report(store: Store, _: int) -> list[bool]:
        return [
            store.write(
                lambda tx, email_id=email_id, position=position, status=status: tx.report_recipient(
                    claimed[email_id].seq, position, status, None, None, 4.2 * day
                )
            )
            for email_id, position, status in reports
        ]

    changed = race(stores, report)
    assert sum(sum(done) for done in changed) == 3, "a report changed a recipient twice"
    counted = stores[1].reads.daily_outcomes(owner, 0.0, 14)
    assert len(counted) == 14
    assert counted[2] == {"sent": 40} and counted[3] == {"failed": 20}
    assert counted[4] == {"bounced": 2, "complained": 1}
    assert sum(sum(d.values()) for d in counted) == 63  # not the other account's
    # The window starts where it is asked to, and leaves out days outside it.
    assert stores[2].reads.daily_outcomes(owner, 3 * day, 2) == [{"failed": 20}, counted[4]]
    assert stores[2].reads.daily_outcomes(other, 0.0, 3)[2] == {"sent": 1}


@pytest.mark.postgres_only
def test_runs_that_count_the_same_days_outcomes_in_opposite_orders_never_wait_in_a_circle(
    stores,
):
    """A delivery thread records a run of outcomes in one transaction, each counted on its
    email's shard of the account's daily count: two runs that reach the same two rows in
    opposite orders must not deadlock (PostgreSQL would find it only after its
    ``deadlock_timeout``, a second, and run one of them again). The counts are held back for
    the commit and sent in the order of their rows."""
    owner = account(stores[0], credits=1000)
    sender_domain(stores[0], owner)
    stores[0].write(
        lambda tx: [
            tx.enqueue_email(new_email(f"em_{n}", owner, "a@verified.test")) for n in range(16)
        ]
    )
    claimed = stores[0].write(lambda tx: tx.claim_due("me", 9.0, 1e9, 16))
    by_shard: dict[int, list[Any]] = {}
    for email in claimed:
        by_shard.setdefault(email.seq % OUTCOME_SHARDS, []).append(email)
    (first, second), (third, fourth) = by_shard[1][:2], by_shard[2][:2]
    # One run records a shard-1 email, then a shard-2 one; the other the other way round.
    plans = [(first, third), (fourth, second)]
    halfway = threading.Barrier(2, timeout=5)
    runs = [0, 0]
    sent = [(0, Recipient("b@example.org", "sent"))]

    def record(store: Store, number: int) -> None:

        def job(tx: Any) -> None:
            runs[number] += 1
            one, other = plans[number]
            tx.finish_attempt(one, "me", "sent", sent, 2.5 * 86400, None, None)
            tx.get_email(owner, one.id)  # (an answer: what waits is on the server now)
            if runs[number] == 1:
                halfway.wait()  # both runs have written their first outcome
            tx.finish_attempt(other, "me", "sent", sent, 2.5 * 86400, None, None)

        store.write(job)

    failed = [outcome for outcome in race(stores[:2], record, rounds=1) if outcome is not None]
    assert not failed, failed  # (a lock timeout before the deadlock was found, say)
    assert runs == [1, 1], "a run met a deadlock and was run again"
    assert stores[0].reads.daily_outcomes(owner, 0.0, 3)[2] == {"sent": 4}


def test_mail_announced_by_one_store_wakes_every_other_that_waits_and_nothing_else_does(stores):
    """``announce_mail`` reaches every store that waits for mail (as another process or host
    would); without one, a wait ends empty; a store that shut down is left out, the others
    still hear."""
    announcer, *listeners = stores[:4]
    for listener in listeners:
        assert listener.wait_for_mail(1.0)  # the first wait listens, and says: look now
    for listener in listeners:
        assert not listener.wait_for_mail(0.1)
    announcer.announce_mail()
    for listener in listeners:
        assert listener.wait_for_mail(5.0)
        assert not listener.wait_for_mail(0.1)  # one announcement is news once
    listeners[0].shutdown()
    time.sleep(0.1)  # (PostgreSQL: announcements closer together than this go as one)
    announcer.announce_mail()
    for listener in listeners[1:]:
        assert listener.wait_for_mail(5.0)
