"""The store's contract under concurrency (mailsvc/store/contract.py): each verb keeps its promise
on its own, with callers racing from several threads, each through a store object of its own
(its own connections, as another worker or host would have)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from mailsvc.mail.dkim import new_signing_key
from mailsvc.store import (
    CreditExhausted,
    DomainExists,
    DomainTaken,
    NewEmail,
    Store,
    TokenExhausted,
)

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


def account(store: Store, credits: int = 0, name: str = "acc_racer") -> str:
    store.write(lambda tx: tx.create_account(name, "Racer", credits, 0.0))
    return name


def test_credit_is_never_overspent(stores):
    payer = account(stores[0], credits=50)
    results = race(stores, lambda s, _: s.write(lambda tx: tx.spend_credits(payer, 1)), rounds=20)
    assert results.count(None) == 50
    assert all(isinstance(result, CreditExhausted) for result in results if result is not None)
    assert stores[0].reads.get_account(payer).credits == 0


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
                    NewEmail(
                        f"em_{number}",
                        owner,
                        None,
                        "a@verified.test",
                        ("b@example.org",),
                        "s",
                        None,
                        "t",
                        None,
                        None,
                        None,
                        f"<em_{number}@verified.test>",
                        100.0,
                    )
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


def test_every_process_gets_the_same_service_secret(stores):
    results = race(stores, lambda s, n: s.write(lambda tx: tx.service_secret("x", bytes([n]) * 16)))
    assert len(set(results)) == 1


def test_mail_is_queued_only_from_a_verified_domain_of_its_account(stores):
    owner, other = account(stores[0], name="acc_owner"), account(stores[0], name="acc_other")
    key = new_signing_key(1024)
    stores[0].write(lambda tx: tx.add_domain("dom_1", other, "theirs.test", True, key, 0.0, "t"))
    stores[0].write(lambda tx: tx.add_domain("dom_2", owner, "pending.test", False, key, 0.0, "t"))
    for sender in ("a@theirs.test", "a@pending.test", "a@nowhere.test"):
        email = NewEmail(
            "em_x", owner, None, sender, ("b@example.org",), "s", None, "t", None, None, None,
            "<em_x@x>", 1.0,
        )  # fmt: skip
        assert stores[0].write(lambda tx, email=email: tx.enqueue_email(email)) is None
    assert stores[0].reads.count_emails_by_status() == {}
