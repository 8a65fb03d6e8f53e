"""Schemathesis against the live app, for every operation of its own OpenAPI document: no 5xx,
every answer's status documented for its operation, its body and headers as documented.

Bounded (``MAX_EXAMPLES`` a operation) so that CI stays well inside its time; on SQLite (the
store contract tests hold the two backends to each other). DNS goes to a server of the test's
own, so webhook URLs and domain checks made up by the fuzzer are answered at once.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from mailsvc import create_app
from mailsvc.http.openapi import build
from mailsvc.routes import URL_MAP

from .conftest import make_tenant
from .dns_server import DnsServer

MAX_EXAMPLES = 40
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    content_type_conformance,
    response_headers_conformance,
]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    dns = DnsServer().start()
    folder = tmp_path_factory.mktemp("fuzz")
    app = create_app(
        {
            "database": str(folder / "fuzz.sqlite3"),
            "outbox": str(folder / "outbox"),
            "dns_servers": dns.address,
            "dns_timeout_seconds": 0.5,
            "dkim_key_bits": 1024,
            "metrics_token": "fuzz-metrics-token",
            "rate_send_per_minute": 1_000_000,
            "rate_list_per_minute": 1_000_000,
            "rate_other_per_minute": 1_000_000,
        }
    )
    tenant = make_tenant(app, credits=10**9)
    app.start()  # live: delivering (into a Maildir), webhooks, ready
    schema.app, schema.location = app, "/v1/openapi.json"
    yield SimpleNamespace(app=app, headers=tenant.headers)
    app.stop()
    dns.stop()


# The document the app serves is this one (test_openapi holds them together); loaded here, it
# is given the live app before the first case (schemathesis's lazy fixture loader does not run
# on pytest 9.2: it reads a private attribute pytest no longer has).
schema = schemathesis.openapi.from_dict(build(URL_MAP))


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_every_operation_holds_under_fuzzing(case, fuzzed):
    headers = dict(fuzzed.headers)
    if case.path == "/metrics":
        headers["Authorization"] = "Bearer fuzz-metrics-token"
    case.call_and_validate(headers=headers, checks=CHECKS, app=fuzzed.app)
