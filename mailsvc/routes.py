"""The routing table: every route of the API, its handler, and what is checked before it runs.

It is also what the OpenAPI document (``GET /v1/openapi.json``, :mod:`mailsvc.http.openapi`) is
built from, with the schemas in ``schemas/``: a route cannot be served and left undocumented.
"""

from __future__ import annotations

from werkzeug.routing import Map, Rule

from .api import (
    account,
    api_keys,
    domains,
    emails,
    public,
    sending,
    suppressions,
    templates,
    webhooks,
)
from .http.auth import FULL, SENDING
from .http.endpoints import LIST, SEND, Endpoint

SEND_EMAIL = Endpoint(
    emails.send_email,
    "Send an email",
    "accepted",
    SEND,
    scopes=(FULL, SENDING),
    schema="send_email",
    parse=sending.parse_send_request,
    writes=True,
    refusals=(402, 403),
    large_body=True,
    permits=sending.permits_send,
)
SEND_BATCH = Endpoint(
    emails.send_batch,
    "Send 1 to 100 emails, all or none",
    "batchAccepted",
    SEND,
    scopes=(FULL, SENDING),
    schema="send_batch",
    parse=sending.parse_batch,
    writes=True,
    refusals=(402, 403),
    large_body=True,
    permits=sending.permits_batch,
)
CANCEL_EMAIL = Endpoint(
    emails.cancel_email,
    "Cancel a scheduled email (its credit given back)",
    "emailChanged",
    scopes=(FULL, SENDING),
    writes=True,
    refusals=(403,),
    permits=emails.permits_change,
)
RESCHEDULE_EMAIL = Endpoint(
    emails.reschedule_email,
    "Move a scheduled email to another time",
    "emailChanged",
    scopes=(FULL, SENDING),
    schema="reschedule",
    parse=emails.parse_reschedule,
    writes=True,
    refusals=(403,),
)
LIST_EMAILS = Endpoint(
    emails.list_emails,
    "List emails, newest first",
    "emailPage",
    LIST,
    schema="list_emails",
    parse=emails.parse_list_query,
)
GET_EMAIL = Endpoint(emails.get_email, "One email, with its timeline", "email", LIST)

CREATE_TEMPLATE = Endpoint(
    templates.create_template,
    "Create a template",
    "template",
    schema="template",
    parse=templates.parse_template,
    status=201,
    writes=True,
)
LIST_TEMPLATES = Endpoint(
    templates.list_templates, "List templates", "templatePage", schema="page_query"
)
GET_TEMPLATE = Endpoint(templates.get_template, "One template", "template")
UPDATE_TEMPLATE = Endpoint(
    templates.update_template,
    "Replace a template",
    "template",
    schema="template",
    parse=templates.parse_template,
    writes=True,
)
DELETE_TEMPLATE = Endpoint(templates.delete_template, "Delete a template", "deleted", writes=True)
RENDER_TEMPLATE = Endpoint(
    templates.render_template,
    "Render a template without sending",
    "rendered",
    schema="render_template",
    writes=True,
)

CREATE_DOMAIN = Endpoint(
    domains.create_domain,
    "Add a sender domain",
    "domain",
    schema="new_domain",
    parse=domains.parse_new_domain,
    status=201,
    writes=True,
    refusals=(409,),
)
LIST_DOMAINS = Endpoint(domains.list_domains, "List domains", "domainPage", schema="page_query")
GET_DOMAIN = Endpoint(domains.get_domain, "One domain, with its DNS records", "domain")
DELETE_DOMAIN = Endpoint(domains.delete_domain, "Delete a domain", "deleted", writes=True)
VERIFY_DOMAIN = Endpoint(
    domains.verify_domain, "Check a domain's DNS records now", "domain", writes=True
)

CREATE_KEY = Endpoint(
    api_keys.create_api_key,
    "Create an API key (its secret shown once)",
    "apiKey",
    schema="new_api_key",
    parse=api_keys.parse_new_key,
    status=201,
    writes=True,
)
LIST_KEYS = Endpoint(api_keys.list_api_keys, "List API keys", "apiKeyPage", schema="page_query")
REVOKE_KEY = Endpoint(api_keys.revoke_api_key, "Revoke an API key", "revoked", writes=True)
GET_ACCOUNT = Endpoint(account.get_account, "Your account, credit and rate limits", "account")

LIST_SUPPRESSIONS = Endpoint(
    suppressions.list_suppressions,
    "List suppressed addresses",
    "suppressionPage",
    schema="list_suppressions",
)
CREATE_SUPPRESSION = Endpoint(
    suppressions.create_suppression,
    "Suppress an address",
    "suppression",
    schema="new_suppression",
    parse=suppressions.parse_new_suppression,
    status=201,
    writes=True,
    refusals=(409,),
)
DELETE_SUPPRESSION = Endpoint(
    suppressions.delete_suppression,
    "Send to an address again",
    "suppressionDeleted",
    writes=True,
    refusals=(400,),
)

CREATE_WEBHOOK = Endpoint(
    webhooks.create_webhook,
    "Create a webhook (its secret shown once)",
    "webhook",
    schema="new_webhook",
    status=201,
    writes=True,
)
LIST_WEBHOOKS = Endpoint(
    webhooks.list_webhooks, "List webhooks", "webhookPage", schema="page_query"
)
GET_WEBHOOK = Endpoint(webhooks.get_webhook, "One webhook", "webhook")
UPDATE_WEBHOOK = Endpoint(
    webhooks.update_webhook,
    "Change a webhook's URL, events or status",
    "webhook",
    schema="webhook_update",
    writes=True,
)
DELETE_WEBHOOK = Endpoint(webhooks.delete_webhook, "Delete a webhook", "deleted", writes=True)
ROTATE_WEBHOOK_SECRET = Endpoint(
    webhooks.rotate_secret, "Give a webhook a new secret", "webhook", writes=True
)
TEST_WEBHOOK = Endpoint(
    webhooks.send_test, "Send a webhook.test event", "webhookTestSent", writes=True
)
LIST_WEBHOOK_DELIVERIES = Endpoint(
    webhooks.list_deliveries,
    "What was delivered to a webhook, newest first",
    "webhookDeliveryPage",
    schema="page_query",
)
RESEND_WEBHOOK_DELIVERY = Endpoint(
    webhooks.resend_delivery,
    "Send a delivery that succeeded or failed again, now",
    "webhookDelivery",
    writes=True,
    refusals=(409,),
)

HEALTH = Endpoint(public.health, "The process answers", "health", public=True)
READY = Endpoint(
    public.readiness,
    "The store answers a write, and delivery runs",
    "ready",
    refusals=(503,),
    public=True,
)
OPENAPI = Endpoint(public.openapi_document, "This document", "openapi", public=True)
METRICS = Endpoint(
    public.metrics,
    "Prometheus metrics (Bearer MAILSVC_METRICS_TOKEN; not served without one)",
    "metrics",
    refusals=(401, 404),
    public=True,
    token_setting="metrics_token",
)

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
        Rule("/v1/webhooks/<webhook_id>/rotate-secret", methods=["POST"],
             endpoint=ROTATE_WEBHOOK_SECRET),
        Rule("/v1/webhooks/<webhook_id>/test", methods=["POST"], endpoint=TEST_WEBHOOK),
        Rule("/v1/webhooks/<webhook_id>/deliveries", methods=["GET"],
             endpoint=LIST_WEBHOOK_DELIVERIES),
        Rule("/v1/webhooks/<webhook_id>/deliveries/<delivery_id>/resend", methods=["POST"],
             endpoint=RESEND_WEBHOOK_DELIVERY),
        Rule("/v1/openapi.json", methods=["GET"], endpoint=OPENAPI),
        Rule("/healthz", methods=["GET"], endpoint=HEALTH),
        Rule("/readyz", methods=["GET"], endpoint=READY),
        Rule("/metrics", methods=["GET"], endpoint=METRICS),
    ]
)  # fmt: skip
