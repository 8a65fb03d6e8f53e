"""Reading a request's input, the body of a POST or PUT or the query of a GET, against the
route's schema. Nothing here raises: a refusal is kept and answered once the caller is known
(the spec orders 401 and 429 before 400)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wrappers import Request

from .errors import BodyTooLarge, ServiceError, UnsupportedMediaType, ValidationFailed
from .routes import Endpoint
from .settings import Settings
from .validation import Schemas


@dataclass(frozen=True)
class Input:
    """What the handler gets, by keyword (``body=`` or ``query=``; none for a route without
    schema), the document it was read from, or the refusal to answer with."""

    arguments: dict[str, Any] = field(default_factory=dict)
    document: Any = None
    refusal: ServiceError | None = None


def read_input(request: Request, endpoint: Endpoint, schemas: Schemas, settings: Settings) -> Input:
    if endpoint.schema is None:
        return Input()
    try:
        from_query = request.method in ("GET", "HEAD")
        document = _query(request) if from_query else _body(request, settings.max_body_bytes)
        # A null optional field means the field is absent, as most JSON clients send it.
        present = {key: value for key, value in document.items() if value is not None}
        schemas.validate(endpoint.schema, present)
        value = endpoint.parse(present, settings) if endpoint.parse else present
        return Input({"query" if from_query else "body": value}, document)
    except ServiceError as exc:
        return Input(refusal=exc)


def _query(request: Request) -> dict[str, str]:
    repeated = [name for name, values in request.args.lists() if len(values) > 1]
    if repeated:
        raise ValidationFailed(f"{repeated[0]}: given more than once")
    return request.args.to_dict()


def _body(request: Request, max_bytes: int) -> dict[str, Any]:
    if request.mimetype != "application/json":
        raise UnsupportedMediaType("Content-Type: must be application/json")
    try:
        raw = request.get_data(cache=False)
    except RequestEntityTooLarge:
        raise BodyTooLarge(f"body: larger than {max_bytes} bytes") from None
    if not raw:
        raise ValidationFailed("body: must be a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationFailed("body: not valid UTF-8") from None
    try:
        document = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ValidationFailed(
            f"body: malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(document, dict):
        raise ValidationFailed("body: must be a JSON object")
    return document


def _refuse_constant(name: str) -> None:
    raise ValidationFailed(f"body: {name} is not valid JSON")
