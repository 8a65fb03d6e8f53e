"""The account endpoint: who the caller is, its credit, its rate limits and its template CPU
time a minute, and what is left of each."""

from __future__ import annotations

from typing import Any

from ..errors import NotFound
from ..http.auth import Principal
from ..http.endpoints import ROUTE_GROUPS
from ..limits import large_body, template_cpu
from ..store import Reads, tokens_at
from .dependencies import Dependencies


def get_account(view: Reads, principal: Principal, deps: Dependencies) -> dict[str, Any]:
    account = view.get_account(principal.account_id)
    if account is None:
        raise NotFound("account: not found")
    limits, remaining = _limits_and_remaining(view, account.id, deps)
    return {
        "id": account.id,
        "name": account.name,
        "credits": account.credits,
        "limits": _by_name(limits),
        "remaining": _by_name(remaining),
    }


def _limits_and_remaining(
    view: Reads, account_id: str, deps: Dependencies
) -> tuple[dict[str, int], dict[str, int]]:
    """Each bucket's limit (the account's own, or the default) and what it holds now, whole
    requests and milliseconds, before this request takes its own token (its
    ``RateLimit-Remaining`` header says what is left after it): one read a bucket."""
    now = deps.clock()
    limits, remaining = {}, {}
    for group in (*ROUTE_GROUPS, template_cpu.GROUP, large_body.GROUP):
        own, bucket = view.get_bucket(account_id, group)
        limits[group] = deps.limiter.per_minute(own, group)
        remaining[group] = max(0, int(tokens_at(bucket, limits[group], now)))  # or owed
    return limits, remaining


def _by_name(figures: dict[str, int]) -> dict[str, int]:
    """Requests a minute by route group, the template CPU milliseconds and the megabytes of
    large bodies a minute, as the API names them."""
    shown = {group: figures[group] for group in ROUTE_GROUPS}
    shown["templateCpuMs"] = figures[template_cpu.GROUP]
    shown["largeBodyMb"] = figures[large_body.GROUP]
    return shown
