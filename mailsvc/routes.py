"""The routing table: every route of the API, its handler, and what is checked before it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from werkzeug.routing import Map, Rule

from .api import account, api_keys, domains, emails, sending, suppressions, templates, webhooks
from .auth import FULL, SENDING
from .ratelimit import LIST, OTHER, SEND
from .settings import Settings
from .validation import Problems


@dataclass(frozen=True)
class Endpoint:
    """A route's handler and what the dispatcher must check before calling it.

    :param handler: a read, ``handler(view, caller, services, **arguments) -> data``, runs in one
        read transaction. A write, ``handler(reads, caller, services, **arguments) -> Change``,
        prepares outside any lock what the dispatcher then applies in one job of the store's
        writer (see :mod:`mailsvc.changes`).
    :param schema: the JSON Schema (in ``schemas/``) of the body, or of the query for a GET.
    :param parse: ``parse(input, settings, problems)`` turns the input, with the settings,
        into what the handler takes, adding its own problems to the schema's and refusing with
        all of them (``problems.raise_if_any()``); no I/O.
    :param large_body: the route takes attachments: its body may be ``max_send_body_bytes``.
    """

    handler: Callable[..., Any]
    rate_group: str
    scopes: tuple[str, ...] = (FULL,)
    schema: str | None = None
    parse: Callable[[Any, Settings, Problems], Any] | None = None
    status: int = 200
    writes: bool = False
    large_body: bool = False


SEND_EMAIL = Endpoint(
    emails.send_email,
    SEND,
    scopes=(FULL, SENDING),
    schema="send_email",
    parse=sending.parse_send_request,
    writes=True,
    large_body=True,
)
SEND_BATCH = Endpoint(
    emails.send_batch,
    SEND,
    scopes=(FULL, SENDING),
    schema="send_batch",
    parse=sending.parse_batch,
    writes=True,
    large_body=True,
)
CANCEL_EMAIL = Endpoint(emails.cancel_email, OTHER, scopes=(FULL, SENDING), writes=True)
RESCHEDULE_EMAIL = Endpoint(
    emails.reschedule_email,
    OTHER,
    scopes=(FULL, SENDING),
    schema="reschedule",
    parse=emails.parse_reschedule,
    writes=True,
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
    writes=True,
)
LIST_TEMPLATES = Endpoint(templates.list_templates, OTHER, schema="page_query")
GET_TEMPLATE = Endpoint(templates.get_template, OTHER)
UPDATE_TEMPLATE = Endpoint(
    templates.update_template,
    OTHER,
    schema="template",
    parse=templates.parse_template,
    writes=True,
)
DELETE_TEMPLATE = Endpoint(templates.delete_template, OTHER, writes=True)
RENDER_TEMPLATE = Endpoint(templates.render_template, OTHER, schema="render_template", writes=True)

CREATE_DOMAIN = Endpoint(
    domains.create_domain,
    OTHER,
    schema="new_domain",
    parse=domains.parse_new_domain,
    status=201,
    writes=True,
)
LIST_DOMAINS = Endpoint(domains.list_domains, OTHER, schema="page_query")
GET_DOMAIN = Endpoint(domains.get_domain, OTHER)
DELETE_DOMAIN = Endpoint(domains.delete_domain, OTHER, writes=True)
VERIFY_DOMAIN = Endpoint(domains.verify_domain, OTHER, writes=True)
CREATE_KEY = Endpoint(
    api_keys.create_api_key,
    OTHER,
    schema="new_api_key",
    parse=api_keys.parse_new_key,
    status=201,
    writes=True,
)
LIST_KEYS = Endpoint(api_keys.list_api_keys, OTHER, schema="page_query")
REVOKE_KEY = Endpoint(api_keys.revoke_api_key, OTHER, writes=True)
GET_ACCOUNT = Endpoint(account.get_account, OTHER)

LIST_SUPPRESSIONS = Endpoint(suppressions.list_suppressions, OTHER, schema="list_suppressions")
CREATE_SUPPRESSION = Endpoint(
    suppressions.create_suppression,
    OTHER,
    schema="new_suppression",
    parse=suppressions.parse_new_suppression,
    status=201,
    writes=True,
)
DELETE_SUPPRESSION = Endpoint(suppressions.delete_suppression, OTHER, writes=True)

CREATE_WEBHOOK = Endpoint(
    webhooks.create_webhook, OTHER, schema="new_webhook", status=201, writes=True
)
LIST_WEBHOOKS = Endpoint(webhooks.list_webhooks, OTHER, schema="page_query")
GET_WEBHOOK = Endpoint(webhooks.get_webhook, OTHER)
UPDATE_WEBHOOK = Endpoint(webhooks.update_webhook, OTHER, schema="webhook_update", writes=True)
DELETE_WEBHOOK = Endpoint(webhooks.delete_webhook, OTHER, writes=True)
ROTATE_WEBHOOK_SECRET = Endpoint(webhooks.rotate_secret, OTHER, writes=True)
TEST_WEBHOOK = Endpoint(webhooks.send_test, OTHER, writes=True)
LIST_WEBHOOK_DELIVERIES = Endpoint(webhooks.list_deliveries, OTHER, schema="page_query")

URL_MAP = Map(
    [
        Rule("/v1/emails", methods=["POST"], endpoint=SEND_EMAIL),
        Rule("/v1/emails", methods=["GET"], endpoint=LIST_EMAILS),
        Rule("/v1/emails/batch", methods=["POST"], endpoint=SEND_BATCH),
        Rule("/v1/emails/<email_id>", methods=["GET"], endpoint=GET_EMAIL),
        Rule("/v1/emails/<email_id>", methods=["PATCH"], endpoint=RESCHEDULE_EMAIL),
        Rule("/v1/emails/<email_id>/cancel", methods=["POST"], endpoint=CANCEL_EMAIL),
        Rule("/v1/templates", methods=["POST"], endpoint=CREATE_TEMPLATE),
        Rule("/v1/templates", methods=["GET"], endpoint=LIST_TEMPLATES),
        Rule("/v1/templates/<template_id>", methods=["GET"], endpoint=GET_TEMPLATE),
        Rule("/v1/templates/<template_id>", methods=["PUT"], endpoint=UPDATE_TEMPLATE),
        Rule("/v1/templates/<template_id>", methods=["DELETE"], endpoint=DELETE_TEMPLATE),
        Rule("/v1/templates/<template_id>/render", methods=["POST"], endpoint=RENDER_TEMPLATE),
        Rule("/v1/domains", methods=["POST"], endpoint=CREATE_DOMAIN),
        Rule("/v1/domains", methods=["GET"], endpoint=LIST_DOMAINS),
        Rule("/v1/domains/<domain_id>", methods=["GET"], endpoint=GET_DOMAIN),
        Rule("/v1/domains/<domain_id>", methods=["DELETE"], endpoint=DELETE_DOMAIN),
        Rule("/v1/domains/<domain_id>/verify", methods=["POST"], endpoint=VERIFY_DOMAIN),
        Rule("/v1/api-keys", methods=["POST"], endpoint=CREATE_KEY),
        Rule("/v1/api-keys", methods=["GET"], endpoint=LIST_KEYS),
        Rule("/v1/api-keys/<key_id>", methods=["DELETE"], endpoint=REVOKE_KEY),
        Rule("/v1/account", methods=["GET"], endpoint=GET_ACCOUNT),
        Rule("/v1/suppressions", methods=["GET"], endpoint=LIST_SUPPRESSIONS),
        Rule("/v1/suppressions", methods=["POST"], endpoint=CREATE_SUPPRESSION),
        Rule("/v1/suppressions/<path:address>", methods=["DELETE"], endpoint=DELETE_SUPPRESSION),
        Rule("/v1/webhooks", methods=["POST"], endpoint=CREATE_WEBHOOK),
        Rule("/v1/webhooks", methods=["GET"], endpoint=LIST_WEBHOOKS),
        Rule("/v1/webhooks/<webhook_id>", methods=["GET"], endpoint=GET_WEBHOOK),
        Rule("/v1/webhooks/<webhook_id>", methods=["PATCH"], endpoint=UPDATE_WEBHOOK),
        Rule("/v1/webhooks/<webhook_id>", methods=["DELETE"], endpoint=DELETE_WEBHOOK),
        Rule(
            "/v1/webhooks/<webhook_id>/rotate-secret",
            methods=["POST"],
            endpoint=ROTATE_WEBHOOK_SECRET,
        ),
        Rule("/v1/webhooks/<webhook_id>/test", methods=["POST"], endpoint=TEST_WEBHOOK),
        Rule(
            "/v1/webhooks/<webhook_id>/deliveries",
            methods=["GET"],
            endpoint=LIST_WEBHOOK_DELIVERIES,
        ),
    ]
)
