"""The account endpoint: who the caller is, its credit and its rate limits."""

from __future__ import annotations

from typing import Any

from ..auth import Principal
from ..errors import NotFound
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
        "limits": services.limiter.limits_for(view, account.id),
    }
