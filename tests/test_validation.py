"""The request schemas are compiled twice (fastjsonschema says quickly whether a document is
valid; jsonschema words what is wrong): the two must give every document the same verdict, or
a body one refuses would slip through the other."""

from __future__ import annotations

import copy
from typing import Any

import fastjsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mailsvc.http.validation import Schemas, load_schema_files

from .conftest import email_body

SCHEMAS = Schemas()
QUICK = SCHEMAS._quick  # noqa: SLF001 (the verdicts under test)

#: A valid document of each request schema, to mutate.
VALID: dict[str, Any] = {
    "send_email": email_body(
        cc=["Carol <carol@example.org>"],
        replyTo="help@example.org",
        headers={"X-Order": "42"},
        tags=[{"name": "kind", "value": "receipt"}],
        attachments=[
            {"filename": "a.pdf", "content": "JVBERg==", "contentType": "application/pdf"},
            {"filename": "i.png", "content": "iVBORw==", "contentId": "logo$1@x"},
        ],
        scheduledAt="2026-12-01T09:00:00Z",
        variables={"n": [1, {"a": None}]},
    ),
    "send_batch": [email_body(), email_body(to=["a@example.org", "b@example.org"])],
    "template": {"name": "t", "subject": "Hi {{ n }}", "html": "<p>x</p>", "text": "x"},
    "render_template": {"variables": {"n": 1}},
    "reschedule": {"scheduledAt": "2026-12-01T09:00:00Z"},
    "new_domain": {"name": "acme.example"},
    "new_api_key": {"name": "web", "scope": "sending", "domain": "acme.example"},
    "new_suppression": {"address": "a@example.org", "reason": "manual"},
    "new_webhook": {"url": "https://h.example/x", "events": ["email.sent", "email.failed"]},
    "webhook_update": {"status": "disabled"},
    "page_query": {"limit": "20", "cursor": "abc"},
    "list_emails": {"limit": "5", "status": "sent", "tag": "k:v", "to": "a@example.org"},
    "list_suppressions": {"reason": "bounced", "limit": "100"},
}

EDGES = st.sampled_from(
    ["", "a", "a@b.co", "x\r\ny", "\x00", "$", "a$b", "10", "0", "101", "sent", "k:v", "A" * 300,
     "a\n", "k:v\n", "10\n", "a@b.co\n", "application/pdf\n",
     "logo$1@x", "application/pdf", "text/x$y", "email.sent", "manual", "enabled"]
)  # fmt: skip
#: Strings most string rules accept (an address, a name, a word).
FINE = st.sampled_from(["a@b.co", "Bo <b@c.de>", "x@y.zz", "k:v", "sent"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False)
    | st.text(max_size=12) | EDGES,
    lambda inner: st.lists(inner, max_size=4)
    | st.lists(FINE, min_size=9, max_size=12)  # over an array's limit, and nothing else wrong
    | st.dictionaries(st.text(max_size=8) | EDGES, inner, max_size=4),
    max_leaves=8,
)  # fmt: skip


def test_every_schema_file_is_a_valid_2020_12_schema():
    from jsonschema import Draft202012Validator

    for schema in load_schema_files().values():
        Draft202012Validator.check_schema(schema)


def test_every_request_schema_has_a_quick_validator_and_an_example():
    requests = set(load_schema_files()) - {"responses"}
    assert set(QUICK) == requests == set(VALID)


@st.composite
def mutated(draw: Any, document: Any) -> Any:
    """The document with a few of its values replaced, removed or added, at any depth."""
    document = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 3))):
        node = document
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            key = draw(
                st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node)))
            )
            if not isinstance(node[key], (dict, list)):
                break
            node = node[key]
        if isinstance(node, dict):
            keys = sorted(node) + [draw(st.text(max_size=6) | EDGES)]
            key = draw(st.sampled_from(keys))
            if key in node and draw(st.booleans()):
                del node[key]
            else:
                node[key] = draw(JSON)
        elif isinstance(node, list) and node:
            node[draw(st.integers(0, len(node) - 1))] = draw(JSON)
    return document


def verdicts(name: str, document: Any) -> tuple[bool, bool]:
    try:
        QUICK[name](document)
        quick = True
    except fastjsonschema.JsonSchemaException:
        quick = False
    worded = not list(SCHEMAS.worded(name).iter_errors(document))
    return quick, worded


@pytest.mark.parametrize("name", sorted(VALID))
def test_the_examples_are_valid(name):
    assert verdicts(name, VALID[name]) == (True, True)


@pytest.mark.parametrize("name", sorted(VALID))
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_both_validators_give_the_same_verdict(name, data):
    document = data.draw(st.one_of(mutated(VALID[name]), JSON))
    quick, worded = verdicts(name, document)
    assert quick == worded, (name, document)


def over(limit: int, item: Any) -> list[Any]:
    return [item] * (limit + 1)


#: Documents over one limit each, and wrong in nothing else: both validators must refuse them.
#: (Several limits stand beside a $ref, which fastjsonschema's draft 7 would ignore.)
OVER_A_LIMIT = [
    ("send_email", email_body(replyTo=over(10, "a@b.co"))),
    ("send_email", email_body(to=[f"r{n}@example.org" for n in range(51)])),
    ("send_email", email_body(subject="s" * 256)),
    ("send_email", email_body(tags=over(50, {"name": "k", "value": "v"}))),
    ("send_email", email_body(headers={f"X-H{n}": "v" for n in range(51)})),
    ("send_email", email_body(headers={"X-Long": "v" * 2001})),
    ("send_email", email_body(attachments=over(100, {"filename": "a", "content": "QQ=="}))),
    ("send_email", email_body(attachments=[{"filename": "f" * 256, "content": "QQ=="}])),
    ("send_batch", over(100, email_body())),
    ("new_webhook", {"url": "https://h.example/x", "events": over(8, "email.sent")}),
    ("template", {"name": "n" * 256, "text": "x"}),
]


@pytest.mark.parametrize(("name", "document"), OVER_A_LIMIT)
def test_a_document_over_a_limit_is_refused_by_both(name, document):
    assert verdicts(name, document) == (False, False)


@pytest.mark.parametrize(
    ("name", "document", "field"),
    [
        ("send_email", email_body(subject="Hi\n"), "subject"),
        ("send_email", email_body(tags=[{"name": "kind\n", "value": "x"}]), "tags[0].name"),
        ("send_email", email_body(attachments=[{"filename": "a", "content": "QQ==",
                                               "contentType": "text/plain\n"}]),
         "attachments[0].contentType"),
        ("list_emails", {"tag": "k:v\n"}, "tag"),
        ("page_query", {"limit": "10\n"}, "limit"),
    ],
)  # fmt: skip
def test_a_trailing_newline_does_not_pass_a_pattern(name, document, field):
    # Python's $ matches before a final newline; JSON Schema's does not. Both validators
    # refuse, and say which field.
    with pytest.raises(fastjsonschema.JsonSchemaException):
        QUICK[name](document)
    assert [problem.field for problem in SCHEMAS.problems(name, document).found] == [field]
