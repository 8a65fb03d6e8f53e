"""The API key endpoints: create (the secret shown once), list without secrets, revoke.

A key's secret exists in clear only in the answer that creates it: the store keeps its hash,
and a retry of the creating request with the same ``Idempotency-Key`` answers the same key with
``"key": null``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ..errors import NotFound, ValidationFailed
from ..http.auth import Principal, issue_key, key_prefix
from ..http.paging import list_page
from ..http.validation import Problems
from ..mail.addresses import normalise_domain
from ..settings import Settings
from ..store import ApiKey, Reads, Writes
from ..timestamps import iso_time
from .change import Change
from .dependencies import Dependencies


def parse_new_key(body: dict[str, Any], settings: Settings, problems: Problems) -> dict[str, Any]:
    """:raises ValidationFailed: ``domain`` is not a domain name (and every other problem).
    No I/O."""
    domain = body.get("domain")
    parsed = None
    if domain and not problems.failed("domain"):
        with problems.checking("domain"):
            parsed = normalise_domain(domain.strip(), "domain")
    problems.raise_if_any()
    return {**body, "domain": parsed}


def create_api_key(
    reads: Reads, principal: Principal, deps: Dependencies, *, body: dict[str, Any]
) -> Change:
    account_id, domain = principal.account_id, body["domain"]
    if domain is not None and not any(
        d.account_id == account_id for d in reads.find_domains(domain)
    ):
        raise ValidationFailed(f"domain: {domain} is not a domain of this account")
    issued, now = issue_key(), deps.clock()
    key = ApiKey(
        issued.id, account_id, issued.secret_hash, body["scope"], False, body["name"], domain, now
    )

    def create(tx: Writes) -> None:
        tx.create_api_key(
            key.id, account_id, key.secret_hash, key.scope, now, name=key.name, domain=domain
        )

    shown = present_key(key)
    return Change(create, {**shown, "key": issued.token}, replayed={**shown, "key": None})


def list_api_keys(
    view: Reads, principal: Principal, deps: Dependencies, *, query: dict[str, Any]
) -> dict[str, Any]:
    def present_all(keys: Sequence[ApiKey]) -> list[dict[str, Any]]:
        return [present_key(key) for key in keys]

    fetch = partial(view.list_api_keys, principal.account_id)
    return list_page(
        query,
        deps.cursors,
        principal.account_id,
        "api-keys",
        fetch,
        lambda key: key.seq,
        present_all,
    )


def revoke_api_key(
    reads: Reads, principal: Principal, deps: Dependencies, *, key_id: str
) -> Change:
    """Revoke one of the account's keys: from the next request on, on every worker, a 401."""
    now = deps.clock()

    def revoke(tx: Writes) -> None:
        if not tx.revoke_api_key(key_id, now, principal.account_id):
            raise NotFound(f"API key {key_id}: not found")

    return Change(revoke, {"id": key_id, "revoked": True})


def present_key(key: ApiKey) -> dict[str, Any]:
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key_prefix(key.id),
        "scope": key.scope,
        "domain": key.domain,
        "createdAt": iso_time(key.created_at),
        "lastUsedAt": iso_time(key.last_used_at),
    }
