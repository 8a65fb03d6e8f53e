"""The API key endpoints: create (the secret shown once), list without secrets, revoke."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ..mail.addresses import normalise_domain
from ..auth import Principal, issue_key, key_prefix
from ..errors import NotFound, ValidationFailed
from ..paging import list_page
from ..services import Services
from ..settings import Settings
from ..store import ApiKey, Transaction
from ..timestamps import iso_time


def parse_new_key(body: dict[str, Any], settings: Settings | None = None) -> dict[str, Any]:
    """:raises ValidationFailed: ``domain`` is not a domain name. No I/O."""
    domain = body.get("domain")
    return {**body, "domain": normalise_domain(domain.strip(), "domain") if domain else None}


def create_api_key(
    tx: Transaction, principal: Principal, services: Services, *, body: dict[str, Any]
) -> dict[str, Any]:
    domain = body["domain"]
    if domain is not None and not any(
        d.account_id == principal.account_id for d in tx.find_domains(domain)
    ):
        raise ValidationFailed(f"domain: {domain} is not a domain of this account")
    issued = issue_key()
    key = tx.create_api_key(
        issued.id,
        principal.account_id,
        issued.secret_hash,
        body["scope"],
        services.clock(),
        name=body["name"],
        domain=domain,
    )
    return {**present_key(key), "key": issued.token}


def list_api_keys(
    tx: Transaction, principal: Principal, services: Services, *, query: dict[str, Any]
) -> dict[str, Any]:
    def present_all(keys: Sequence[ApiKey]) -> list[dict[str, Any]]:
        return [present_key(key) for key in keys]

    fetch = partial(tx.list_api_keys, principal.account_id)
    return list_page(query, fetch, lambda key: key.seq, present_all)


def revoke_api_key(
    tx: Transaction, principal: Principal, services: Services, *, key_id: str
) -> dict[str, Any]:
    """Revoke one of the account's keys: from the next request on, on every worker, a 401."""
    if not tx.revoke_api_key(key_id, services.clock(), principal.account_id):
        raise NotFound(f"API key {key_id}: not found")
    return {"id": key_id, "revoked": True}


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
