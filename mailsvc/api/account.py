"""The account endpoint: who the caller is, its credit, its rate limits and its template CPU
time a minute."""

from __future__ import annotations

from typing import Any

from .. import template_cpu
from ..auth import Principal
from ..errors import NotFound
from ..ratelimit import ROUTE_GROUPS
from ..services import Services
from ..store import Reads


def get_account(view: Reads, principal: Principal, services: Services) -> dict[str, Any]:
    account = view.get_account(principal.account_id)
    if account is None:
        raise NotFound("account: not found")
    return {
        "id": account.id,
        "name": account.name,
        "credits": account.credits,
        "limits": _limits(services.limiter.limits_for(view, account.id)),
    }


def _limits(limits: dict[str, int]) -> dict[str, int]:
    """Requests a minute by route group, and the template CPU milliseconds a minute."""
    shown = {group: limits[group] for group in ROUTE_GROUPS}
    shown["templateCpuMs"] = limits[template_cpu.GROUP]
    return shown
