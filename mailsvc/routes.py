"""The routing table: every route of the API, its handler, and what is checked before it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from werkzeug.routing import Map, Rule

from . import emails, templates
from .auth import FULL, SENDING
from .ratelimit import LIST, OTHER, SEND


@dataclass(frozen=True)
class Endpoint:
    """A route's handler and what the dispatcher must check before calling it.

    :param schema: the JSON Schema (in ``schemas/``) of the body, or of the query for a GET.
    :param parse: turns schema-valid input into what the handler takes; pure, may refuse.
    """

    handler: Callable[..., dict[str, Any]]
    rate_group: str
    scopes: tuple[str, ...] = (FULL,)
    schema: str | None = None
    parse: Callable[[dict[str, Any]], Any] | None = None
    status: int = 200
    wakes_delivery: bool = False


SEND_EMAIL = Endpoint(
    emails.send_email,
    SEND,
    scopes=(FULL, SENDING),
    schema="send_email",
    parse=emails.parse_send_request,
    wakes_delivery=True,
)
LIST_EMAILS = Endpoint(
    emails.list_emails, LIST, schema="list_emails", parse=emails.parse_list_query
)
GET_EMAIL = Endpoint(emails.get_email, LIST)
CREATE_TEMPLATE = Endpoint(
    templates.create_template,
    OTHER,
    schema="template",
    parse=templates.parse_template,
    status=201,
)
LIST_TEMPLATES = Endpoint(templates.list_templates, OTHER, schema="page_query")
GET_TEMPLATE = Endpoint(templates.get_template, OTHER)
UPDATE_TEMPLATE = Endpoint(
    templates.update_template, OTHER, schema="template", parse=templates.parse_template
)
DELETE_TEMPLATE = Endpoint(templates.delete_template, OTHER)
RENDER_TEMPLATE = Endpoint(templates.render_template, OTHER, schema="render_template")

URL_MAP = Map(
    [
        Rule("/v1/emails", methods=["POST"], endpoint=SEND_EMAIL),
        Rule("/v1/emails", methods=["GET"], endpoint=LIST_EMAILS),
        Rule("/v1/emails/<email_id>", methods=["GET"], endpoint=GET_EMAIL),
        Rule("/v1/templates", methods=["POST"], endpoint=CREATE_TEMPLATE),
        Rule("/v1/templates", methods=["GET"], endpoint=LIST_TEMPLATES),
        Rule("/v1/templates/<template_id>", methods=["GET"], endpoint=GET_TEMPLATE),
        Rule("/v1/templates/<template_id>", methods=["PUT"], endpoint=UPDATE_TEMPLATE),
        Rule("/v1/templates/<template_id>", methods=["DELETE"], endpoint=DELETE_TEMPLATE),
        Rule("/v1/templates/<template_id>/render", methods=["POST"], endpoint=RENDER_TEMPLATE),
    ]
)
