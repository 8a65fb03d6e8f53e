"""The account endpoint: who the caller is, its credit, its rate limits and its template CPU
time a minute, and what is left of each."""

from __future__ import annotations

from typing import Any

from .. import template_cpu
from ..auth import Principal
from ..errors import NotFound
from ..ratelimit import ROUTE_GROUPS
from ..services import Services
from ..store import Reads, tokens_at


def get_account(view: Reads, principal: Principal, services: Services) -> dict[str, Any]:
    account = view.get_account(principal.account_id)
    if account is None:
        raise NotFound("account: not found")
    limits = services.limiter.limits_for(view, account.id)
    return {
        "id": account.id,
        "name": account.name,
        "credits": account.credits,
        "limits": _by_name(limits),
        "remaining": _by_name(_remaining(view, account.id, limits, services.clock())),
    }


def _remaining(view: Reads, account_id: str, limits: dict[str, int], now: float) -> dict[str, int]:
    """What each bucket holds now, whole requests and milliseconds, before this request takes
    its own token (its ``RateLimit-Remaining`` header says what is left after it)."""
    left = {}
    for group in (*ROUTE_GROUPS, template_cpu.GROUP):
        _, bucket = view.get_bucket(account_id, group)
        left[group] = int(tokens_at(bucket, limits[group], now))
    return left


def _by_name(figures: dict[str, int]) -> dict[str, int]:
    """Requests a minute by route group, and the template CPU milliseconds a minute, as the API
    names them."""
    shown = {group: figures[group] for group in ROUTE_GROUPS}
    shown["templateCpuMs"] = figures[template_cpu.GROUP]
    return shown
