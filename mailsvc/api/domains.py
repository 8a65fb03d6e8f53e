"""The domain endpoints: add a sender domain, show the DNS records to publish, check them.

A domain becomes ``verified`` when its ownership record and its DKIM record are found in DNS;
the SPF and DMARC records are recommendations, reported but not required. A name verified by one
account cannot be verified by another: the store's unique constraint decides.

The RSA key of a new domain is made, and the DNS look-ups of a check are made, in the request's
own thread after the caller is known, never inside the store's writer.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any

from ..errors import AlreadyExists, NotFound, ValidationFailed
from ..http.auth import Principal
from ..http.paging import list_page
from ..http.validation import Problems
from ..ids import new_id
from ..mail.addresses import normalise_domain
from ..mail.dkim import new_signing_key
from ..mail.dns import FOUND, PENDING, REQUIRED, Expected, expected_records, judge
from ..settings import Settings
from ..store import Domain, DomainExists, DomainTaken, Reads, Writes
from ..timestamps import iso_time
from .change import Change
from .dependencies import Dependencies


def parse_new_domain(body: dict[str, Any], settings: Settings, problems: Problems) -> str:
    """The normalised name. No I/O.

    :raises ValidationFailed: the name is not a domain name (or the body has other problems).
    """
    problems.raise_if_any()
    return normalise_domain(body["name"].strip(), "name")


def create_domain(reads: Reads, principal: Principal, deps: Dependencies, *, body: str) -> Change:
    """Add a pending domain with a new DKIM key; the key is made only for a name the account
    does not have yet."""
    name, account_id = body, principal.account_id
    _refuse_if_mine(name, account_id, reads.find_domains(name))
    key, token, now = (
        new_signing_key(deps.settings.dkim_key_bits),
        secrets.token_hex(16),
        deps.clock(),
    )
    domain = Domain(new_id("dom"), account_id, name, False, key, token, now)

    def create(tx: Writes) -> None:
        try:
            tx.create_domain(domain.id, account_id, name, key, now, token)
        except DomainExists:  # added meanwhile, by another request of the account's
            _refuse_if_mine(name, account_id, tx.find_domains(name))
            raise

    return Change(create, present_domain(domain, deps.settings))


def list_domains(
    view: Reads, principal: Principal, deps: Dependencies, *, query: dict[str, Any]
) -> dict[str, Any]:
    def present_all(domains: Sequence[Domain]) -> list[dict[str, Any]]:
        return [present_domain(domain, deps.settings) for domain in domains]

    fetch = partial(view.list_domains, principal.account_id)
    return list_page(
        query,
        deps.cursors,
        principal.account_id,
        "domains",
        fetch,
        lambda domain: domain.seq,
        present_all,
    )


def get_domain(
    view: Reads, principal: Principal, deps: Dependencies, *, domain_id: str
) -> dict[str, Any]:
    return present_domain(_find(view, principal.account_id, domain_id), deps.settings)


def delete_domain(
    reads: Reads, principal: Principal, deps: Dependencies, *, domain_id: str
) -> Change:
    def delete(tx: Writes) -> None:
        if not tx.delete_domain(principal.account_id, domain_id):
            raise NotFound(f"domain {domain_id}: not found")

    return Change(delete, {"id": domain_id, "deleted": True})


def verify_domain(
    reads: Reads, principal: Principal, deps: Dependencies, *, domain_id: str
) -> Change:
    """Look the domain's records up in DNS now and keep what was found."""
    return check_domain(reads, deps, principal.account_id, domain_id)


def check_domain(reads: Reads, deps: Dependencies, account_id: str, domain_id: str) -> Change:
    """The DNS check of a domain, for the API and the operator alike: the look-ups are made
    now, in parallel, holding nothing; the change records what they found.

    :raises ValidationFailed: another account verified the name already.
    """
    domain = _find(reads, account_id, domain_id)
    if any(d.verified and d.account_id != account_id for d in reads.find_domains(domain.name)):
        raise ValidationFailed(_taken_message(domain.name))
    records = _expected(domain, deps.settings)
    with ThreadPoolExecutor(max_workers=len(records)) as pool:
        lookups = list(pool.map(lambda record: deps.dns.txt(record.name), records))
    now = deps.clock()
    checks = {
        record.purpose: {**judge(record, lookup), "checkedAt": now}
        for record, lookup in zip(records, lookups, strict=True)
    }
    verified = all(checks[purpose]["status"] == FOUND for purpose in REQUIRED)

    def record(tx: Writes) -> None:
        try:
            if tx.record_domain_check(domain.id, checks, now, verified) is None:
                raise NotFound(f"domain {domain_id}: not found")
        except DomainTaken:
            raise ValidationFailed(_taken_message(domain.name)) from None

    checked = replace(
        domain,
        verified=domain.verified or verified,
        verified_at=domain.verified_at if domain.verified else (now if verified else None),
        checked_at=now,
        checks=checks,
    )
    return Change(record, present_domain(checked, deps.settings))


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


def _refuse_if_mine(name: str, account_id: str, entries: Sequence[Domain]) -> None:
    mine = [entry for entry in entries if entry.account_id == account_id]
    if mine:
        raise AlreadyExists(f"name: {name} is already a domain of this account ({mine[0].id})")


def _taken_message(name: str) -> str:
    return f"name: {name} is already verified by another account"


def _find(reads: Reads, account_id: str, domain_id: str) -> Domain:
    domain = reads.get_domain(account_id, domain_id)
    if domain is None:
        raise NotFound(f"domain {domain_id}: not found")
    return domain
