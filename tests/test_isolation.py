"""One account can never make another wait: while one account runs the most expensive requests
it can make, on every thread it can get, another account's reads and sends each answer within a
second, on real gunicorn workers."""

from __future__ import annotations

import threading
import time

import pytest

from mailsvc import operator

from .conftest import VERIFIED, email_body, wait_until
from .servers import Gunicorn, request
from .test_pipeline import REPEATED, SPIN

pytestmark = pytest.mark.slow


def test_the_most_expensive_requests_of_one_account_hold_up_no_other(served_tenant):
    path, store, _, victim = served_tenant
    attacker_account = operator.create_account(store, "Attacker", 1_000_000)["id"]
    for group in ("send", "list", "other"):  # its limits raised, so it can spend what it likes
        operator.set_limit(store, attacker_account, group, 1_000_000)
    operator.add_domain(store, attacker_account, "attacker.test", verified=True)
    attacker = {"Authorization": f"Bearer {operator.create_key(store, attacker_account)['key']}"}
    server = Gunicorn({"MAILSVC_DATABASE": path}, workers=2).start()
    try:
        status, template = request(
            server.port, "POST", "/v1/templates", {"name": "spin", "text": SPIN}, attacker
        )
        assert status == 201
        costly = [
            ("POST", f"/v1/templates/{template['id']}/render", {"variables": {}}),
            (
                "POST",
                "/v1/emails",
                email_body(from_="a@attacker.test", template_id=template["id"], text=None),
            ),
            ("POST", "/v1/domains", {"name": "keys.attacker.test"}),  # an RSA key each time
            ("POST", "/v1/templates", {"name": "big", "text": REPEATED[:99_000]}),
            ("POST", "/v1/emails", email_body(from_="a@attacker.test", text="x" * 900_000)),
        ]
        stop = threading.Event()
        attacks: list[int] = []

        def attack(number: int) -> None:
            while not stop.is_set():
                method, url, body = costly[number % len(costly)]
                attacks.append(request(server.port, method, url, body, attacker)[0])
                number += 1

        attackers = [threading.Thread(target=attack, args=(n,)) for n in range(8)]
        for thread in attackers:
            thread.start()
        # The attack is in full swing: every attacker has been answered at least once.
        wait_until(lambda: len(attacks) >= 2 * len(attackers), 60, "the attack")
        waited: list[tuple[float, str, int]] = []
        for _ in range(8):
            for method, url, body in [
                ("GET", "/v1/account", None),
                ("GET", "/v1/emails", None),
                ("POST", "/v1/emails", email_body()),
            ]:
                started = time.monotonic()
                status, _ = request(server.port, method, url, body, victim)
                waited.append((time.monotonic() - started, f"{method} {url}", status))
        stop.set()
        for thread in attackers:
            thread.join()
    finally:
        log = server.stop()
    assert {status for _, _, status in waited} == {200}, waited
    assert max(seconds for seconds, _, _ in waited) < 1.0, sorted(waited)[-5:]
    # The attack really ran: its renders were refused at their CPU limit, and it kept going.
    assert len(attacks) >= 20 and 400 in attacks, attacks
    assert "Traceback" not in log
    assert VERIFIED
