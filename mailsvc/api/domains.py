"""The domain endpoints: add a sender domain, show the DNS records to publish, check them.

A domain becomes ``verified`` when its ownership record and its DKIM record are found in DNS;
the SPF and DMARC records are recommendations, reported but not required. A name verified by one
account cannot be verified by another.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..mail.addresses import normalise_domain
from ..auth import Principal
from ..mail.dns import FOUND, PENDING, REQUIRED, Expected, expected_records, judge
from ..errors import AlreadyExists, NotFound, ValidationFailed
from ..ids import new_id
from ..paging import list_page
from ..services import Services
from ..settings import Settings
from ..mail.dkim import SigningKey, new_signing_key
from ..store import Database, Domain, DomainTaken, Transaction
from ..timestamps import iso_time


@dataclass(frozen=True)
class NewDomain:
    name: str
    signing_key: SigningKey
    token: str


def parse_new_domain(body: dict[str, Any], settings: Settings) -> NewDomain:
    """The normalised name, with the DKIM key and ownership token made for it, before any
    transaction (making an RSA key takes a while). No I/O.

    :raises ValidationFailed: the name is not a domain name.
    """
    return NewDomain(
        normalise_domain(body["name"].strip(), "name"),
        new_signing_key(settings.dkim_key_bits),
        secrets.token_hex(16),
    )


def create_domain(
    tx: Transaction, principal: Principal, services: Services, *, body: NewDomain
) -> dict[str, Any]:
    mine = [d for d in tx.find_domains(body.name) if d.account_id == principal.account_id]
    if mine:
        raise AlreadyExists(f"name: {body.name} is already a domain of this account ({mine[0].id})")
    domain = tx.add_domain(
        new_id("dom"),
        principal.account_id,
        body.name,
        False,
        body.signing_key,
        services.clock(),
        body.token,
    )
    return present_domain(domain, services.settings)


def list_domains(
    tx: Transaction, principal: Principal, services: Services, *, query: dict[str, Any]
) -> dict[str, Any]:
    def present_all(domains: Sequence[Domain]) -> list[dict[str, Any]]:
        return [present_domain(domain, services.settings) for domain in domains]

    fetch = partial(tx.list_domains, principal.account_id)
    return list_page(query, fetch, lambda domain: domain.seq, present_all)


def get_domain(
    tx: Transaction, principal: Principal, services: Services, *, domain_id: str
) -> dict[str, Any]:
    return present_domain(_find(tx, principal.account_id, domain_id), services.settings)


def delete_domain(
    tx: Transaction, principal: Principal, services: Services, *, domain_id: str
) -> dict[str, Any]:
    if not tx.delete_domain(principal.account_id, domain_id):
        raise NotFound(f"domain {domain_id}: not found")
    return {"id": domain_id, "deleted": True}


def verify_domain(
    db: Database, principal: Principal, services: Services, *, domain_id: str
) -> dict[str, Any]:
    """Look the domain's records up in DNS now and keep what was found.

    Runs its own two short transactions: the look-ups, which can take seconds, never hold the
    store's write lock.
    """
    return check_domain(db, services, principal.account_id, domain_id)


def check_domain(
    db: Database, services: Services, account_id: str, domain_id: str
) -> dict[str, Any]:
    """:raises ValidationFailed: another account verified the name already."""
    with db.transaction() as tx:
        domain = _find(tx, account_id, domain_id)
        _refuse_if_taken(tx, domain)
    records = _expected(domain, services.settings)
    with ThreadPoolExecutor(max_workers=len(records)) as pool:
        lookups = list(pool.map(lambda record: services.dns.txt(record.name), records))
    checks = {
        record.purpose: {**judge(record, lookup), "checkedAt": services.clock()}
        for record, lookup in zip(records, lookups, strict=True)
    }
    verified = all(checks[purpose]["status"] == FOUND for purpose in REQUIRED)
    with db.transaction() as tx:
        try:
            updated = tx.record_domain_check(domain.id, checks, services.clock(), verified)
        except DomainTaken:
            raise ValidationFailed(_taken_message(domain.name)) from None
    if updated is None:
        raise NotFound(f"domain {domain_id}: not found")
    return present_domain(updated, services.settings)


def present_domain(domain: Domain, settings: Settings) -> dict[str, Any]:
    records = [
        {
            "type": "TXT",
            "name": record.name,
            "value": record.value,
            "purpose": record.purpose,
            "required": record.required,
            **_shown_check(domain.checks.get(record.purpose)),
        }
        for record in _expected(domain, settings)
    ]
    return {
        "id": domain.id,
        "name": domain.name,
        "status": "verified" if domain.verified else "pending",
        "records": records,
        "createdAt": iso_time(domain.created_at),
        "verifiedAt": iso_time(domain.verified_at),
        "lastCheckedAt": iso_time(domain.checked_at),
    }


def _shown_check(check: dict[str, Any] | None) -> dict[str, Any]:
    if check is None:
        return {"status": PENDING}
    return {**check, "checkedAt": iso_time(check.get("checkedAt"))}


def _expected(domain: Domain, settings: Settings) -> list[Expected]:
    assert domain.signing_key is not None and domain.verification_token is not None
    return expected_records(
        domain.name,
        domain.verification_token,
        domain.signing_key,
        settings.spf_record,
        settings.dmarc_record,
    )


def _refuse_if_taken(tx: Transaction, domain: Domain) -> None:
    if any(d.verified and d.account_id != domain.account_id for d in tx.find_domains(domain.name)):
        raise ValidationFailed(_taken_message(domain.name))


def _taken_message(name: str) -> str:
    return f"name: {name} is already verified by another account"


def _find(tx: Transaction, account_id: str, domain_id: str) -> Domain:
    domain = tx.get_domain(account_id, domain_id)
    if domain is None:
        raise NotFound(f"domain {domain_id}: not found")
    return domain
