"""Request schemas: loaded from ``schemas/`` and compiled once, and their failures as messages.

A failure is a :class:`Problem` that names the field and the rule (``"to: at most 50
recipients"``); a schema can give the text for a keyword in an ``x-messages`` object where the
generic text would be vague. A request's parser adds its own problems to the schema's
(:class:`Problems`), and the client gets them all in one 400: every unknown field, every bad
field, in a stable order, up to :data:`MAX_REPORTED`.

What a refusal costs is bounded by the body's size and by :data:`MAX_COLLECTED`, never by the
number of its faults squared: each problem is added and looked up in constant time, the schema
check stops once it has found :data:`MAX_COLLECTED` problems (the parser does not run then),
and the items of an array longer than its ``maxItems`` (the fields of an object with more than
its ``maxProperties``) are not looked at one by one: the count is what is wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fastjsonschema

from ..errors import ValidationFailed

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

#: Problems listed in one answer at most; the rest are counted.
MAX_REPORTED = 20
#: Problems the schema check collects at most; past this it stops, and the answer says so.
MAX_COLLECTED = 100
#: The schema keywords whose failure leaves the items (fields) of their value unchecked.
_SKIPPING = frozenset({"maxItems", "maxProperties"})

_TYPE_NAMES = {
    "string": "a string",
    "array": "an array",
    "object": "an object",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
}


class Schemas:
    """Every schema in the ``mailsvc.schemas`` package, compiled, by file stem.

    Each is compiled twice: by ``fastjsonschema`` into Python code, which says quickly whether
    a document is valid (what nearly every request is), and by ``jsonschema``, whose errors
    name the field and the rule, for the documents that are not. (The test suite holds the two
    to the same verdict.)
    """

    def __init__(self) -> None:
        schemas, self._quick = _compiled()
        self._schemas = schemas
        self._validators: dict[str, Draft202012Validator] = {}
        #: The schemas whose documents are JSON arrays (a batch), not objects.
        self.arrays = {name for name, schema in schemas.items() if schema.get("type") == "array"}

    def worded(self, name: str) -> Draft202012Validator:
        """jsonschema's validator of a schema, made the first time a document is refused: the
        library (and what it loads, a few megabytes in each worker) is needed only then."""
        if name not in self._validators:
            self._validators[name] = _bounded_validator()(
                self._schemas[name], registry=self._registry
            )
        return self._validators[name]

    @cached_property
    def _registry(self) -> Any:
        """Every schema by its ``$id``: they refer to each other (``page_query.json#/...``)."""
        from referencing import Registry, Resource

        return Registry().with_resources(
            (schema["$id"], Resource.from_contents(schema)) for schema in self._schemas.values()
        )

    def problems(self, name: str, instance: Any) -> Problems:
        """What is wrong with ``instance`` by schema ``name``, most shallow first."""
        problems = Problems()
        quick = self._quick.get(name)
        if quick is not None:
            try:
                quick(instance)
                return problems
            except fastjsonschema.JsonSchemaException:
                pass  # jsonschema says what is wrong, in words
        errors: list[ValidationError] = []
        for error in self.worded(name).iter_errors(instance):
            if len(errors) == MAX_COLLECTED:
                problems.stopped = True
                break
            errors.append(error)
        for error in _ordered(errors):
            for problem in describe(error):
                problems.add_problem(problem)
            if error.validator in _SKIPPING:
                problems.leave_unchecked(field_path(error.absolute_path))
        return problems

    def validate(self, name: str, instance: Any) -> None:
        """:raises ValidationFailed: with every failure, named by field, most shallow first."""
        self.problems(name, instance).raise_if_any()


@cache
def _compiled() -> tuple[dict[str, Any], dict[str, Callable[[Any], Any]]]:
    """The schemas, and their ``fastjsonschema`` functions: the files are the package's own
    and do not change, so every app of a process shares one compilation (about 100 ms)."""
    schemas = {name: _end_is_end(schema) for name, schema in load_schema_files().items()}
    drafted = {name: _as_draft7(schema) for name, schema in schemas.items()}
    quick = {
        name: fastjsonschema.compile(schema, handlers={"": _file_of(drafted)})
        for name, schema in drafted.items()
        if name != "responses"
    }
    return schemas, quick


@dataclass(frozen=True)
class Problem:
    """One rule an input breaks: where (``""``: the body as a whole) and what."""

    field: str
    text: str

    def __str__(self) -> str:
        return self.text


class _Found:
    """The problems of one input, shared by the views of its parts."""

    def __init__(self) -> None:
        self.listed: list[Problem] = []
        self.seen: set[Problem] = set()
        #: Every field with a problem, and every field that holds one (``to``, ``[3]``).
        self.failed_fields: set[str] = set()
        #: Arrays and objects whose items or fields were not checked one by one (there were
        #: more than their ``maxItems`` or ``maxProperties``): nothing in them is checked.
        self.unchecked: set[str] = set()
        #: The schema check stopped at :data:`MAX_COLLECTED`: there may be more.
        self.stopped = False


class Problems:
    """Everything wrong with one input, collected before it is refused.

    :param prefix: where the input stands in a larger one (``"[3]."``: a batch's fourth
        item); the problems of a view made with :meth:`within` go to the same list.
    """

    def __init__(self, prefix: str = "", found: _Found | None = None) -> None:
        self.prefix = prefix
        self._found = _Found() if found is None else found

    def within(self, prefix: str) -> Problems:
        """The problems of a part of the input, named from where it stands."""
        return Problems(self.prefix + prefix, self._found)

    @property
    def found(self) -> list[Problem]:
        return self._found.listed

    @property
    def stopped(self) -> bool:
        """Whether the schema check gave up counting (the input has more problems than
        :data:`MAX_COLLECTED`)."""
        return self._found.stopped

    @stopped.setter
    def stopped(self, value: bool) -> None:
        self._found.stopped = value

    @property
    def parsable(self) -> bool:
        """Whether the parser may run: the schema checked every part it has not refused (it
        did not stop counting, nor leave the whole input unchecked, as a batch of too many
        items)."""
        return not self._found.stopped and "" not in self._found.unchecked

    def _named(self, field: str) -> str:
        return (self.prefix + field).rstrip(".") if field else self.prefix.rstrip(".")

    def add(self, field: str, rule: str) -> None:
        named = self._named(field)
        self.add_problem(Problem(named, f"{named or 'body'}: {rule}"))

    def add_problem(self, problem: Problem) -> None:
        found = self._found
        if problem in found.seen:
            return
        found.seen.add(problem)
        found.listed.append(problem)
        found.failed_fields.update(_enclosing(problem.field))

    def leave_unchecked(self, field: str) -> None:
        """Nothing inside ``field`` has been checked: a parser must leave it all alone."""
        self._found.unchecked.add(self._named(field))

    def failed(self, field: str = "") -> bool:
        """Whether ``field`` (or, not given, this part of the input), or anything inside it,
        has a problem already, or what holds it was left unchecked."""
        named, found = self._named(field), self._found
        if found.unchecked and ("" in found.unchecked or found.unchecked & set(_enclosing(named))):
            return True
        if not named:
            return bool(found.listed)
        return named in found.failed_fields

    @contextmanager
    def checking(self, field: str = "") -> Iterator[None]:
        """Run a parser's check of ``field``: a refusal it raises (its message names the
        field) becomes a problem here."""
        try:
            yield
        except ValidationFailed as exc:
            self.add_problem(Problem(self._named(field), self.prefix + exc.message))

    def raise_if_any(self) -> None:
        """:raises ValidationFailed: listing every problem (the first :data:`MAX_REPORTED`)."""
        listed = self._found.listed
        if not listed:
            return
        shown = [str(problem) for problem in listed[:MAX_REPORTED]]
        more = len(listed) - len(shown)
        if self._found.stopped:
            tail = f"; and {more} more (the check stops at {MAX_COLLECTED} problems)"
        else:
            tail = f"; and {more} more" if more > 0 else ""
        raise ValidationFailed("; ".join(shown) + tail)


def _enclosing(field: str) -> Iterator[str]:
    """``field`` and each field that holds it: ``[3].to[2]``, ``[3].to``, ``[3]``."""
    yield field
    for index in range(len(field) - 1, 0, -1):
        if field[index] in ".[":
            yield field[:index]


def _end_is_end(schema: Any) -> Any:
    """The schema with each ``pattern``'s ``$`` read as the end of the text, as JSON Schema's
    regular expressions (ECMA 262) read it: Python's ``$`` also matches before a final newline,
    so ``"a\\n"`` would pass ``^[a-z]+$``. (fastjsonschema makes the same change itself.)"""
    if isinstance(schema, list):
        return [_end_is_end(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: _UNESCAPED_DOLLAR.sub(r"\\Z", value)
        if key == "pattern" and isinstance(value, str)
        else _end_is_end(value)
        for key, value in schema.items()
    }


_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")


def _as_draft7(schema: Any) -> Any:
    """The schema as fastjsonschema reads it (draft 7, where keywords beside a ``$ref`` are
    ignored): each ``$ref`` with siblings becomes ``allOf`` of the reference and the siblings,
    which is what 2020-12 means by them."""
    if isinstance(schema, list):
        return [_as_draft7(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rewritten = {key: _as_draft7(value) for key, value in schema.items()}
    siblings = {k: v for k, v in rewritten.items() if k != "$ref" and not k.startswith(("x-", "$"))}
    if "$ref" in rewritten and siblings:
        return {"allOf": [{"$ref": rewritten["$ref"]}, siblings]}
    return rewritten


def _file_of(schemas: dict[str, dict[str, Any]]) -> Any:
    """How fastjsonschema finds another file a schema refers to (``page_query.json#...``)."""
    return lambda uri: schemas[uri.split("#")[0].removesuffix(".json")]


def load_schema_files() -> dict[str, dict[str, Any]]:
    """Every schema file, parsed, by its stem (``send_email``)."""
    return {
        entry.name.removesuffix(".json"): json.loads(entry.read_text())
        for entry in sorted(_schema_folder().iterdir(), key=lambda entry: entry.name)
        if entry.name.endswith(".json")
    }


def _schema_folder() -> Traversable:
    """``mailsvc/schemas`` once installed; the top-level ``schemas/`` when run from a checkout.

    Installation maps ``schemas/`` into the package. Run from a checkout (gunicorn puts the
    working folder first on ``sys.path``), the source ``mailsvc/`` is imported instead and the
    schemas stand beside it.
    """
    try:
        return resources.files("mailsvc.schemas")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "schemas"


def _ordered(errors: list[ValidationError]) -> list[ValidationError]:
    """Most shallow first, then in the order of the document's fields and items (``to[2]``
    before ``to[10]``)."""
    return sorted(
        errors,
        key=lambda error: (
            len(error.absolute_path),
            [(isinstance(part, int), part) for part in error.absolute_path],
        ),
    )


@cache
def _bounded_validator() -> Any:
    """jsonschema's 2020-12 validator, except that it does not look at each item of an array
    longer than its ``maxItems``, nor at each field of an object with more than its
    ``maxProperties``: ``maxItems`` or ``maxProperties`` says what is wrong, and a body of
    100,000 items is refused for the price of one."""
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import ValidationError

    def at_most(kind: str) -> Any:
        # jsonschema's own puts the whole value's repr in its message: a list of 100,000
        # items took 4 ms to refuse. The message is never shown (``describe`` words it).
        def check(validator: Any, limit: Any, instance: Any, schema: Any) -> Any:
            if validator.is_type(instance, kind) and len(instance) > limit:
                yield ValidationError(f"more than {limit}")

        return check

    def within(keyword: str, bound: str, kind: str) -> Any:
        check = Draft202012Validator.VALIDATORS[keyword]

        def bounded(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
            if (
                validator.is_type(instance, kind)
                and bound in schema
                and len(instance) > schema[bound]
            ):
                return
            yield from check(validator, value, instance, schema)

        return bounded

    return validators.extend(
        Draft202012Validator,
        {
            "maxItems": at_most("array"),
            "maxProperties": at_most("object"),
            "items": within("items", "maxItems", "array"),
            "prefixItems": within("prefixItems", "maxItems", "array"),
            "contains": within("contains", "maxItems", "array"),
            "properties": within("properties", "maxProperties", "object"),
            "additionalProperties": within("additionalProperties", "maxProperties", "object"),
            "patternProperties": within("patternProperties", "maxProperties", "object"),
        },
    )


def describe(error: ValidationError) -> list[Problem]:
    """The problems of one schema failure (one per missing or unknown field)."""
    field = field_path(error.absolute_path)
    keyword = str(error.validator)
    custom = error.schema.get("x-messages", {}) if isinstance(error.schema, Mapping) else {}
    if keyword == "required":
        missing = [name for name in error.validator_value if name not in error.instance]
        return [_problem(_join(field, name), "is required") for name in missing]
    if keyword == "additionalProperties" and isinstance(error.instance, Mapping):
        known = set(error.schema.get("properties", {}))
        unknown = sorted(name for name in error.instance if name not in known)
        rule = custom.get(keyword, "unknown field")
        return [_problem(_join(field, name), rule) for name in unknown]
    rule = custom.get(keyword, _rule(keyword, error.validator_value))
    if keyword in custom and ": " in rule:  # the text names the field itself (``html: ...``)
        return [Problem(field, f"{field}.{rule}" if field else rule)]
    return [_problem(field, rule)]


def _problem(field: str, rule: str) -> Problem:
    return Problem(field, f"{field or 'body'}: {rule}")


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
    if keyword == "maxProperties":
        return f"at most {value} fields"
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
