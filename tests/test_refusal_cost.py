"""What refusing a body costs is bounded by its size, never by its faults squared: the schema
check stops at a hundred problems, the items of an array over its ``maxItems`` are not looked at
one by one, problems are added and looked up in constant time, and a body with more items and
fields than any request needs is refused before it is parsed."""

from __future__ import annotations

import json
import time

import pytest

from mailsvc.http import strict_json
from mailsvc.http.validation import MAX_COLLECTED, Problem, Problems

from .conftest import assert_error, email_body


def post(client, tenant, path, document):
    headers = {**tenant.headers, "Content-Type": "application/json"}
    return client.post(path, data=json.dumps(document), headers=headers)


def test_the_items_of_an_array_over_its_limit_are_not_each_refused(client, tenant, app):
    body = assert_error(post(client, tenant, "/v1/emails", email_body(to=[1] * 4000)), 400)
    assert body["message"] == "to: at most 50 recipients"
    with app.store.read() as view:
        assert view.count_emails_by_status() == {}


def test_a_batch_over_its_limit_is_refused_without_reading_its_items(client, tenant):
    batch = [email_body(to=[1] * 40)] * 101  # every item wrong too
    body = assert_error(post(client, tenant, "/v1/emails/batch", batch), 400)
    assert body["message"] == "body: at most 100 emails"


def test_the_schema_check_stops_at_a_hundred_problems_and_says_so(client, tenant):
    batch = [email_body(to=[1] * 40, cc=["x"] * 40)] * 100  # 8,000 problems
    body = assert_error(post(client, tenant, "/v1/emails/batch", batch), 400)
    assert body["message"].endswith(
        f"; and {MAX_COLLECTED - 20} more (the check stops at {MAX_COLLECTED} problems)"
    )
    assert (
        body["message"].count(": must be a string")
        + body["message"].count(": at least 3 characters")
        == 20
    )
    # Shown in the order of the items: cc[2] before cc[10].
    assert body["message"].index("[0].cc[2]:") < body["message"].index("[0].cc[10]:")


def test_problems_are_added_and_looked_up_in_constant_time():
    # Quadratic, 40,000 problems and as many look-ups took minutes; linear, a fraction of a
    # second. The bound is generous so that a slow machine cannot fail it.
    problems = Problems()
    started = time.process_time()
    for index in range(40_000):
        item = problems.within(f"[{index // 50}].")
        item.add(f"to[{index % 50}]", "must be a string")
        item.add(f"to[{index % 50}]", "must be a string")  # the same problem once
        assert item.failed("to") and item.failed(f"to[{index % 50}]")
        assert not item.failed("cc")
    assert time.process_time() - started < 5
    assert len(problems.found) == 40_000
    assert problems.found[0] == Problem("[0].to[0]", "[0].to[0]: must be a string")


def test_a_field_left_unchecked_counts_as_failed_with_everything_inside_it():
    problems = Problems()
    problems.leave_unchecked("")
    item = problems.within("[7].")
    assert item.failed("to") and item.failed("from") and item.failed()
    other = Problems()
    other.leave_unchecked("to")
    assert other.failed("to[3]") and not other.failed("cc") and not other.failed("tour")


OVER = strict_json.MAX_VALUES + 1


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("numbers", json.dumps({"variables": {"n": [1] * OVER}})),
        ("strings", json.dumps({"variables": {"n": ["a"] * OVER}})),
        ("fields", json.dumps({"variables": {str(i): 1 for i in range(OVER)}})),
        ("empty arrays", json.dumps({"variables": {"n": [[]] * OVER}})),
    ],
)
def test_a_body_with_too_many_values_is_refused_before_it_is_parsed(
    client, tenant, app, case, text, monkeypatch
):
    parsed = []
    monkeypatch.setattr(strict_json, "_inspect", lambda *args: parsed.append(args))
    headers = {**tenant.headers, "Content-Type": "application/json"}
    response = client.post("/v1/emails", data=text.encode(), headers=headers)
    assert_error(response, 400, f"body: more than {strict_json.MAX_VALUES} items and fields")
    assert parsed == []


def test_commas_inside_strings_are_not_counted(client, tenant):
    prose = "Dear friend, " * (strict_json.MAX_VALUES + 10)  # 100,010 commas, one string
    quoted = 'He said, "yes, \\", and left. ' * 1000  # escaped quotes and backslashes
    body = email_body(html=prose, text=quoted)
    response = post(client, tenant, "/v1/emails", body)
    assert response.status_code == 200, response.get_data(as_text=True)


def test_exactly_the_most_values_are_accepted(client, tenant):
    variables = {"n": [1] * (strict_json.MAX_VALUES - 10)}
    response = post(client, tenant, "/v1/emails", email_body(variables=variables))
    assert response.status_code == 200, response.get_data(as_text=True)
