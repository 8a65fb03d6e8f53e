"""The OpenAPI 3.1 document of the API, built from the routing table and the schemas in
``schemas/``, so that it cannot drift from what is served.

Every rule of :data:`mailsvc.routes.URL_MAP` is an operation. Its request body, or its query
parameters, is the route's request schema; its 2xx answer the ``responses.json`` schema the route
names; its refusals the statuses every route of its kind has (:func:`statuses`) and those its
handler adds, each with the error schema. The schema files go into ``components/schemas`` whole,
their references rewritten to point inside the document.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.routing import Map, Rule

from .auth import FULL
from .endpoints import Endpoint
from .validation import load_schema_files

_ARGUMENT = re.compile(r"<(?:[a-z]+:)?([a-z_]+)>")
_READS = ("GET", "HEAD")

#: What each refusal means, as the document says it.
REASONS = {
    400: "The body, the query or a header breaks a rule; the message names each field and rule",
    401: "No API key, or an unknown or revoked one",
    402: "Not enough credit; the message says what was needed and what is available",
    403: "The key's scope or sender domain does not allow this",
    404: "No such resource of this account",
    408: "The body arrived more slowly than MAILSVC_BODY_MIN_BYTES_PER_SECOND",
    409: "It exists already",
    413: "The body is larger than the limit",
    415: "The body is not application/json",
    422: "The Idempotency-Key was used with another request",
    429: "Rate limit reached (or no room for another large body of this account); see Retry-After",
    503: "Not now: the store cannot take it (a full disk, a server out of reach), no room for "
    "another large body in this process, or not ready; see Retry-After",
}


def statuses(rule: Rule, endpoint: Endpoint) -> list[int]:
    """Every status the operation answers with: its success, those every route of its kind has,
    and its handler's own refusals."""
    method = _method(rule)
    found = {endpoint.status, *endpoint.refusals}
    if not endpoint.public:
        found |= {401, 429, 503}
        if rule.arguments:
            found.add(404)
        if endpoint.scopes == (FULL,):
            found.add(403)
    if endpoint.schema is not None:
        found.add(400)
        if method not in _READS:
            found |= {408, 413, 415}
    if method == "POST" and endpoint.writes:
        found |= {400, 422}  # a malformed Idempotency-Key; one used with another request
    return sorted(found)


def build(url_map: Map, version: str = "0.0.0") -> dict[str, Any]:
    """The document of the routes of ``url_map``, of the API at ``version``."""
    schemas = {name: _inside(name, schema) for name, schema in load_schema_files().items()}
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(url_map.iter_rules(), key=lambda r: r.rule):
        endpoint: Endpoint = rule.endpoint  # type: ignore[assignment]
        path = route_template(rule)
        paths.setdefault(path, {})[_method(rule).lower()] = _operation(rule, endpoint, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mailsvc",
            "version": version,
            "description": "A self-hosted transactional email service. Every error is "
            "`{statusCode, message, error}`; every answer of a rate-limited route carries "
            "RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"apiKey": []}],
    }


def route_template(rule: Rule) -> str:
    """The rule as the document names its path (``/v1/emails/{email_id}``); each request's
    route, for its log line and metrics."""
    return _template(rule.rule)


@lru_cache(maxsize=256)
def _template(rule: str) -> str:
    return _ARGUMENT.sub(r"{\1}", rule)


def _method(rule: Rule) -> str:
    return next(
        method for method in sorted(rule.methods or ()) if method not in ("HEAD", "OPTIONS")
    )


def _operation(rule: Rule, endpoint: Endpoint, schemas: dict[str, Any]) -> dict[str, Any]:
    method = _method(rule)
    words = re.sub(r"[^a-z0-9]+", "_", rule.rule.lower()).strip("_")
    operation: dict[str, Any] = {
        "operationId": f"{method.lower()}_{words}",
        "summary": endpoint.summary,
        "parameters": [
            {
                "name": name,
                "in": "path",
                "required": True,
                "schema": {"type": "string", "minLength": 1},
            }
            for name in sorted(rule.arguments)
        ],
        "responses": _responses(rule, endpoint),
    }
    if endpoint.public:  # no API key; metrics want their own token, as a bearer too
        operation["security"] = [{"apiKey": []}] if 401 in endpoint.refusals else []
        operation["tags"] = ["operations"]
    else:
        operation["tags"] = [rule.rule.split("/")[2]]
    if endpoint.schema is not None and method in _READS:
        query = schemas[endpoint.schema]
        operation["parameters"] += [
            {"name": name, "in": "query", "required": False, "schema": property}
            for name, property in query.get("properties", {}).items()
        ]
    elif endpoint.schema is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{endpoint.schema}"}}
            },
        }
    if method == "POST" and endpoint.writes:
        operation["parameters"].append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "Retried with the same key and body within a day, the request "
                "gets its first answer again and changes nothing.",
                "schema": {"type": "string", "minLength": 1, "maxLength": 255},
            }
        )
    return operation


def _responses(rule: Rule, endpoint: Endpoint) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    for status in statuses(rule, endpoint):
        if status < 400:
            answers[str(status)] = _success(endpoint)
        else:
            answers[str(status)] = {
                "description": REASONS.get(status, HTTP_STATUS_CODES[status]),
                "content": {"application/json": {"schema": _ref("responses", "error")}},
            }
    answers["default"] = {
        "description": "An unexpected failure (500): logged with its traceback; the message "
        "names nothing internal",
        "content": {"application/json": {"schema": _ref("responses", "error")}},
    }
    if not endpoint.public:
        rate_limit = {
            name: {"schema": {"type": "integer"}, "description": description}
            for name, description in (
                ("RateLimit-Limit", "Requests a minute in this route's group"),
                ("RateLimit-Remaining", "Requests left now"),
                ("RateLimit-Reset", "Seconds until the bucket is full again"),
            )
        }
        for code, answer in answers.items():
            if code not in ("401", "default"):  # no known key: not rate limited
                answer["headers"] = dict(rate_limit)
        answers["429"]["headers"]["Retry-After"] = {
            "schema": {"type": "integer", "minimum": 1},
            "description": "Seconds to wait before trying again",
        }
    return answers


def _success(endpoint: Endpoint) -> dict[str, Any]:
    if endpoint.response == "metrics":
        return {
            "description": "Prometheus text exposition",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    return {
        "description": endpoint.summary,
        "content": {"application/json": {"schema": _ref("responses", endpoint.response)}},
    }


def _ref(name: str, definition: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}/$defs/{definition}"}


def _inside(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A schema file as a component: its ``$id`` and ``$schema`` dropped (the document is their
    base) and every ``$ref`` pointed inside the document."""
    copied = copy.deepcopy(schema)
    copied.pop("$id", None)
    copied.pop("$schema", None)
    for node in _nodes(copied):
        reference = node.get("$ref")
        if isinstance(reference, str):
            file, _, pointer = reference.partition("#")
            target = file.removesuffix(".json") if file else name
            node["$ref"] = f"#/components/schemas/{target}{pointer}"
    return copied


def _nodes(value: Any) -> Iterable[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _nodes(item)
    elif isinstance(value, list):
        for item in value:
            yield from _nodes(item)
