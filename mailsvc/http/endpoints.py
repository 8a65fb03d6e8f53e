"""What the dispatcher must know of a route before it calls the route's handler: its checks, its
input, its rate-limit group; the routing table (:mod:`mailsvc.routes`) is made of these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..settings import Settings
from .auth import FULL
from .validation import Problems

#: The route groups, each with its rate limit (SPEC section 8): sending, listing, the rest.
SEND = "send"
LIST = "list"
OTHER = "other"
ROUTE_GROUPS = (SEND, LIST, OTHER)


@dataclass(frozen=True)
class Endpoint:
    """A route's handler and what the dispatcher must check before calling it.

    :param handler: a read, ``handler(view, caller, deps, **arguments) -> data``, runs in one
        read transaction. A write, ``handler(reads, caller, deps, **arguments) -> Change``,
        prepares outside any lock what the dispatcher then applies in one job of the store's
        writer (see :mod:`mailsvc.api.change`). A public route's, ``handler(process) -> data``
        (:mod:`mailsvc.api.public`).
    :param summary: what it does, for the OpenAPI document.
    :param response: the schema of its 2xx answer (``responses.json#/$defs/<response>``).
    :param schema: the JSON Schema (in ``schemas/``) of the body, or of the query for a GET.
    :param parse: ``parse(input, settings, problems)`` turns the input, with the settings,
        into what the handler takes, adding its own problems to the schema's and refusing with
        all of them (``problems.raise_if_any()``); no I/O.
    :param refusals: the statuses its handler refuses with, besides those every route of its
        kind has (401, 429, 400 for its input, 404 for an id, 403 for a scope: see
        :func:`mailsvc.http.openapi.statuses`).
    :param large_body: the route takes attachments: its body may be ``max_send_body_bytes``.
    :param permits: ``permits(reads, caller, **arguments)`` raises :class:`~.errors.Forbidden`
        when the caller may not do this with these arguments though its scope allows the
        route (a key limited to one sender domain); checked before an idempotent answer is
        replayed or anything is prepared.
    :param public: no API key, no rate limit (health, the document, metrics).
    :param token_setting: a public route that wants ``Authorization: Bearer <that setting>``,
        and is not served while the setting is empty.
    """

    handler: Callable[..., Any]
    summary: str
    response: str
    rate_group: str = OTHER
    scopes: tuple[str, ...] = (FULL,)
    schema: str | None = None
    parse: Callable[[Any, Settings, Problems], Any] | None = None
    status: int = 200
    writes: bool = False
    refusals: tuple[int, ...] = ()
    large_body: bool = False
    permits: Callable[..., None] | None = None
    public: bool = False
    token_setting: str | None = None
