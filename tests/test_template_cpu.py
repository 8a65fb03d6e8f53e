"""Each account's template CPU time a minute (mailsvc/template_cpu.py): a bucket of milliseconds
in the store, drawn on by every render of the account, on every worker and host, and by no
other account. The clock is frozen, so that no bucket refills unless a test moves it."""

from __future__ import annotations

from typing import Any

import pytest
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.limits.template_cpu import GROUP

from .conftest import assert_error, email_body, make_tenant
from .test_pipeline import SPIN

RENDER_MS = 100  # MAILSVC_TEMPLATE_RENDER_CPU_MS in these tests


class Frozen:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def template(client: Client, tenant, text: str) -> str:
    made = client.post("/v1/templates", json={"name": "t", "text": text}, headers=tenant.headers)
    assert made.status_code == 201, made.get_json()
    return made.get_json()["id"]


def send(client: Client, tenant, template_id: str, **fields: Any):
    body = email_body(template_id=template_id, text=None, **fields)
    return client.post("/v1/emails", json=body, headers=tenant.headers)


def tokens_left(app, tenant) -> float:
    _, bucket = app.store.reads.get_bucket(tenant.id, GROUP)
    assert bucket is not None, "the bucket was never charged"
    return bucket[0]


def emails_of(client: Client, tenant) -> list[dict[str, Any]]:
    return client.get("/v1/emails", headers=tenant.headers).get_json()["data"]


def test_an_account_that_used_its_template_cpu_is_refused_until_it_refills(config):
    config.update(template_render_cpu_ms=RENDER_MS, template_cpu_ms_per_minute=250)
    clock = Frozen()
    app = create_app(config, clock=clock)
    spinner, other = make_tenant(app), make_tenant(app, domain="other.test")
    client = Client(app)
    spin = template(client, spinner, SPIN)
    # Its compile drew on the bucket too (over 50 ms on a slow day): full again a minute on.
    clock.now += 60
    answers = [send(client, spinner, spin) for _ in range(4)]
    # Two renders stop at their own limit (a 400 of the template's), the third at what the
    # account had left, the fourth before it begins.
    assert [answer.status_code for answer in answers] == [400, 400, 429, 429]
    assert_error(answers[0], 400, f"more than {RENDER_MS} ms of CPU")
    for refused in answers[2:]:
        assert_error(refused, 429, "template CPU", "250 ms", "MAILSVC_TEMPLATE_CPU_MS_PER_MINUTE")
        assert int(refused.headers["Retry-After"]) >= 1
    # Everything it used is charged, refused or not: the last render's overrun is owed.
    assert -5 < tokens_left(app, spinner) <= 0
    assert emails_of(client, spinner) == []
    preview = client.post(
        f"/v1/templates/{spin}/render", json={"variables": {}}, headers=spinner.headers
    )
    assert_error(preview, 429, "MAILSVC_TEMPLATE_CPU_MS_PER_MINUTE")
    # A send without a template, and another account's templates, go on as before.
    assert client.post("/v1/emails", json=email_body(), headers=spinner.headers).status_code == 200
    hello = template(client, other, "Hello {{ name }}")
    greeted = send(client, other, hello, variables={"name": "Ann"}, from_="a@other.test")
    assert greeted.status_code == 200, greeted.get_json()
    # A minute later the bucket is full again: the template meets its own limit, not the
    # account's.
    clock.now += 60
    assert_error(send(client, spinner, spin), 400, f"more than {RENDER_MS} ms of CPU")


def test_what_a_render_uses_is_charged_to_its_account(config):
    config.update(template_render_cpu_ms=RENDER_MS, template_cpu_ms_per_minute=10_000)
    app = create_app(config, clock=Frozen())
    tenant, client = make_tenant(app), Client(app)
    cheap = template(client, tenant, "Hello {{ name }}")
    compiled = tokens_left(app, tenant)  # its compile drew on the bucket (67 ms on a slow day)
    assert send(client, tenant, cheap, variables={"name": "Ann"}).status_code == 200
    cheap_cost = compiled - tokens_left(app, tenant)  # charged with the email's own write
    assert 0 < cheap_cost < 20, cheap_cost
    spin = template(client, tenant, SPIN)
    compiled = tokens_left(app, tenant)
    assert send(client, tenant, spin).status_code == 400
    spin_cost = compiled - tokens_left(app, tenant)
    assert RENDER_MS <= spin_cost < RENDER_MS + 50, spin_cost
    assert [email["status"] for email in emails_of(client, tenant)] == ["queued"]


def test_a_batch_of_templates_stops_at_the_accounts_cpu_and_queues_nothing(config):
    config.update(template_render_cpu_ms=RENDER_MS, template_cpu_ms_per_minute=250)
    app = create_app(config, clock=Frozen())
    tenant, client = make_tenant(app), Client(app)
    spin = template(client, tenant, SPIN)
    batch = [email_body(template_id=spin, text=None) for _ in range(5)]
    answer = client.post("/v1/emails/batch", json=batch, headers=tenant.headers)
    assert_error(answer, 429, "MAILSVC_TEMPLATE_CPU_MS_PER_MINUTE")
    assert -5 < tokens_left(app, tenant) <= 0
    assert emails_of(client, tenant) == []


def test_the_bucket_is_shared_by_every_worker_and_an_account_may_have_its_own(config):
    config.update(template_render_cpu_ms=RENDER_MS, template_cpu_ms_per_minute=100_000)
    clock = Frozen()
    first, second = create_app(config, clock=clock), create_app(config, clock=clock)
    tenant = make_tenant(first)
    operator.set_limit(first.store, tenant.id, GROUP, 250)  # its own, below the default
    spin = template(Client(first), tenant, SPIN)
    assert [send(Client(first), tenant, spin).status_code for _ in range(2)] == [400, 400]
    # The other worker (or host) finds what the first left: less than one render's limit.
    assert_error(send(Client(second), tenant, spin), 429, "250 ms")
    assert -5 < tokens_left(second, tenant) <= 0


def test_compiling_a_template_draws_on_the_same_bucket(config):
    config.update(template_render_cpu_ms=RENDER_MS, template_cpu_ms_per_minute=10_000)
    app = create_app(config, clock=Frozen())
    tenant, client = make_tenant(app), Client(app)
    # 450 tags: milliseconds of parsing and compiling, none of rendering (and a source no
    # other test compiled: the worker keeps what it compiled).
    large = tenant.id + "".join(f"{{{{ v{n} }}}}{{% if v{n} %}}-{{% endif %}}" for n in range(150))
    template(client, tenant, large)
    assert 10_000 - tokens_left(app, tenant) > 1.0
    operator.set_limit(app.store, tenant.id, GROUP, 1)  # 1 ms a minute: what is left, at most
    template(client, tenant, large + " ")  # it found some left, and used more: owed
    assert -1.0 <= tokens_left(app, tenant) < 0  # a minute's worth owed at most
    refused = client.post(
        "/v1/templates", json={"name": "t", "text": large + "  "}, headers=tenant.headers
    )
    assert_error(refused, 429, "MAILSVC_TEMPLATE_CPU_MS_PER_MINUTE")
    listed = client.get("/v1/templates", headers=tenant.headers).get_json()["data"]
    assert len(listed) == 2


def test_the_account_shows_what_is_left_of_each_limit(config):
    """``GET /v1/account`` shows each bucket as it stands, the template CPU milliseconds with
    the request limits: before this request's own token, which its header counts."""
    config.update(
        template_render_cpu_ms=RENDER_MS,
        template_cpu_ms_per_minute=250,
        rate_send_per_minute=10,
        rate_list_per_minute=30,
    )
    clock = Frozen()
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    fresh = client.get("/v1/account", headers=tenant.headers)
    limits = {"send": 10, "list": 30, "other": 60, "templateCpuMs": 250, "largeBodyMb": 100}
    assert fresh.get_json()["limits"] == fresh.get_json()["remaining"] == limits
    assert fresh.headers["RateLimit-Remaining"] == "59"  # (the account is in the other group)
    spin = template(client, tenant, SPIN)
    for _ in range(2):
        sent = client.post("/v1/emails", json=email_body(), headers=tenant.headers)
        assert sent.status_code == 200, sent.get_json()
    assert [send(client, tenant, spin).status_code for _ in range(3)] == [400, 400, 429]
    shown = client.get("/v1/account", headers=tenant.headers).get_json()["remaining"]
    # Four sends took a token (a 429 takes none); the first look and the template one each.
    assert shown == {"send": 6, "list": 30, "other": 58, "templateCpuMs": 0, "largeBodyMb": 100}
    clock.now += 30  # half a minute: each bucket refills by half its limit, up to its limit
    owed = tokens_left(app, tenant)
    assert -5 < owed <= 0
    shown = client.get("/v1/account", headers=tenant.headers).get_json()["remaining"]
    assert shown == {**limits, "templateCpuMs": int(125 + owed)}
    # Another account's are its own.
    other = make_tenant(app, domain="other.test")
    assert client.get("/v1/account", headers=other.headers).get_json()["remaining"] == limits


def test_an_account_that_owes_template_cpu_waits_until_it_has_paid(config):
    """A render that overran what was left is charged in full; the account's renders are
    refused until the bucket has refilled above empty, and the 429 says when that is."""
    config.update(template_render_cpu_ms=RENDER_MS, template_cpu_ms_per_minute=250)
    clock = Frozen()
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    hello = template(client, tenant, "Hello {{ name }}")
    # 150 ms more spent than was left (as a render stopped late would be charged): owed.
    spent = tokens_left(app, tenant) + 150.0  # (the compile above drew on it too)
    app.store.write(lambda tx: tx.charge_bucket(tenant.id, GROUP, spent, 250, clock.now))
    assert tokens_left(app, tenant) == pytest.approx(-150.0)
    refused = send(client, tenant, hello, variables={"name": "Ann"})
    assert_error(refused, 429, "MAILSVC_TEMPLATE_CPU_MS_PER_MINUTE")
    assert refused.headers["Retry-After"] == "37"  # (150 + 1) ms at 250 a minute: 36.24 s
    clock.now += 36  # 150 ms back: empty, not yet above it
    assert send(client, tenant, hello, variables={"name": "Ann"}).status_code == 429
    clock.now += 1
    sent = send(client, tenant, hello, variables={"name": "Ann"})
    assert sent.status_code == 200, sent.get_json()
