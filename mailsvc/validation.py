"""Request schemas: loaded from ``schemas/`` and compiled once, and their failures as messages.

A failure becomes a :class:`~mailsvc.errors.ValidationFailed` whose message names the field
and the rule (``"to: at most 50 recipients"``). A schema can give the text for a keyword in an
``x-messages`` object where the generic text would be vague.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource

from .errors import ValidationFailed

_TYPE_NAMES = {
    "string": "a string",
    "array": "an array",
    "object": "an object",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
}


class Schemas:
    """Every schema in the ``mailsvc.schemas`` package, compiled, by file stem."""

    def __init__(self) -> None:
        schemas = {
            entry.name.removesuffix(".json"): json.loads(entry.read_text())
            for entry in _schema_folder().iterdir()
            if entry.name.endswith(".json")
        }
        # Schemas refer to each other by their $id (``page_query.json#/$defs/limit``).
        registry: Registry[Any] = Registry().with_resources(
            (schema["$id"], Resource.from_contents(schema)) for schema in schemas.values()
        )
        self._validators: dict[str, Draft202012Validator] = {}
        for name, schema in schemas.items():
            Draft202012Validator.check_schema(schema)
            self._validators[name] = Draft202012Validator(schema, registry=registry)

    def validate(self, name: str, instance: Any) -> None:
        """Check ``instance`` against schema ``name``.

        :raises ValidationFailed: with every failure, named by field, most shallow first.
        """
        errors = list(self._validators[name].iter_errors(instance))
        if errors:
            raise ValidationFailed(
                "; ".join(_unique(describe(error) for error in _ordered(errors)))
            )


def _schema_folder() -> Traversable:
    """``mailsvc/schemas`` once installed; the top-level ``schemas/`` when run from a checkout.

    Installation maps ``schemas/`` into the package. Run from a checkout (gunicorn puts the
    working folder first on ``sys.path``), the source ``mailsvc/`` is imported instead and the
    schemas stand beside it.
    """
    try:
        return resources.files("mailsvc.schemas")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "schemas"


def _ordered(errors: list[ValidationError]) -> list[ValidationError]:
    return sorted(
        errors, key=lambda error: (len(error.absolute_path), field_path(error.absolute_path))
    )


def _unique(messages: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(messages))


def describe(error: ValidationError) -> str:
    """``"<field>: <rule>"`` for one schema failure."""
    field = field_path(error.absolute_path)
    keyword = str(error.validator)
    custom = error.schema.get("x-messages", {}) if isinstance(error.schema, Mapping) else {}
    if keyword == "required":
        missing = [name for name in error.validator_value if name not in error.instance]
        field, rule = _join(field, missing[0]), "is required"
    elif keyword == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        unknown = sorted(name for name in error.instance if name not in known)
        field, rule = _join(field, unknown[0]), "unknown field"
    else:
        rule = _rule(keyword, error.validator_value)
    if keyword in custom:
        rule = custom[keyword]
        if not field:  # at the top level there is no field to name: the schema's text names it
            return rule
    return f"{field or 'body'}: {rule}"


def _rule(keyword: str, value: Any) -> str:
    if keyword == "type":
        names = [value] if isinstance(value, str) else list(value)
        return "must be " + " or ".join(_TYPE_NAMES.get(name, name) for name in names)
    if keyword == "maxLength":
        return f"at most {value} characters"
    if keyword == "minLength":
        return "must not be empty" if value == 1 else f"at least {value} characters"
    if keyword == "maxItems":
        return f"at most {value} items"
    if keyword == "minItems":
        return f"at least {value} item" + ("s" if value != 1 else "")
    if keyword == "enum":
        return "must be one of " + ", ".join(json.dumps(option) for option in value)
    if keyword in ("minimum", "maximum"):
        return ("at least " if keyword == "minimum" else "at most ") + str(value)
    if keyword == "pattern":
        return "has characters that are not allowed"
    return f"does not satisfy {keyword}"


def field_path(path: Iterable[Any]) -> str:
    """``to[3]``, ``variables.user.name``: where a value is in a document."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name
