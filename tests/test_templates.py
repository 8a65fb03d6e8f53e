"""Templates: CRUD per account, sandboxed rendering, sending with templateId."""

from __future__ import annotations

import mailbox

import pytest
from werkzeug.test import Client

from mailsvc import create_app, operator

from .conftest import assert_error, email_body, make_tenant
from .test_delivery import post, wait_status

WELCOME = {
    "name": "welcome",
    "subject": "Welcome, {{ user.name }}",
    "html": "<p>Hello {{ user.name }}, your code is <b>{{ code }}</b></p>",
    "text": "Hello {{ user.name }}, your code is {{ code }}",
}


def create(client, tenant, **fields):
    response = client.post("/v1/templates", json={**WELCOME, **fields}, headers=tenant.headers)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def test_create_show_replace_delete(client, tenant):
    template = create(client, tenant)
    assert set(template) == {"id", "name", "subject", "html", "text", "createdAt", "updatedAt"}
    assert template["id"].startswith("tpl_") and template["name"] == "welcome"
    url = f"/v1/templates/{template['id']}"
    assert client.get(url, headers=tenant.headers).get_json() == template
    replaced = client.put(
        url, json={"name": "hello", "text": "Hi {{ name }}"}, headers=tenant.headers
    )
    assert replaced.status_code == 200
    body = replaced.get_json()
    assert body["name"] == "hello" and body["html"] is None and body["subject"] is None
    assert client.delete(url, headers=tenant.headers).get_json() == {
        "id": template["id"],
        "deleted": True,
    }
    assert_error(client.get(url, headers=tenant.headers), 404, "not found")


def test_list_is_paged_newest_first(client, tenant):
    ids = [create(client, tenant, name=f"t{n}")["id"] for n in range(5)]
    page = client.get("/v1/templates?limit=3", headers=tenant.headers).get_json()
    assert [t["id"] for t in page["data"]] == ids[::-1][:3] and page["hasMore"]
    rest = client.get(
        f"/v1/templates?cursor={page['nextCursor']}", headers=tenant.headers
    ).get_json()
    assert [t["id"] for t in rest["data"]] == ids[::-1][3:] and not rest["hasMore"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"html": "<p>\n{{ name }</p>"}, "html: template syntax error at line 2"),
        ({"text": "{% if %}"}, "text: template syntax error at line 1"),
        ({"subject": "Hi {{ }}"}, "subject: template syntax error"),
        ({"html": None, "text": None}, "html: at least one of html or text is required"),
        ({"name": ""}, "name: must not be empty"),
        ({"subject": "a\r\nBcc: x"}, "subject: must not contain CR, LF or NUL"),
    ],
)
def test_invalid_templates_are_refused(client, tenant, fields, message):
    body = {key: value for key, value in {**WELCOME, **fields}.items() if value is not None}
    assert_error(client.post("/v1/templates", json=body, headers=tenant.headers), 400, message)
    template = create(client, tenant)
    update = client.put(f"/v1/templates/{template['id']}", json=body, headers=tenant.headers)
    assert_error(update, 400, message)


def test_another_accounts_template_is_not_found_anywhere(client, tenant, app):
    template = create(client, tenant)
    other = make_tenant(app, domain="other.test")
    url = f"/v1/templates/{template['id']}"
    assert_error(client.get(url, headers=other.headers), 404)
    assert_error(client.put(url, json=WELCOME, headers=other.headers), 404)
    assert_error(client.delete(url, headers=other.headers), 404)
    assert_error(client.post(url + "/render", json={}, headers=other.headers), 404)
    send = email_body(from_="x@other.test", template_id=template["id"], text=None)
    assert_error(
        client.post("/v1/emails", json=send, headers=other.headers),
        400,
        f"templateId: template {template['id']} not found",
    )
    assert client.get(url, headers=tenant.headers).status_code == 200


def test_render_escapes_html_only_and_sends_nothing(client, tenant):
    template = create(client, tenant)
    variables = {"user": {"name": "<Tom & Jerry>"}, "code": "4242"}
    response = client.post(
        f"/v1/templates/{template['id']}/render",
        json={"variables": variables},
        headers=tenant.headers,
    )
    assert response.get_json() == {
        "subject": "Welcome, <Tom & Jerry>",
        "html": "<p>Hello &lt;Tom &amp; Jerry&gt;, your code is <b>4242</b></p>",
        "text": "Hello <Tom & Jerry>, your code is 4242",
    }
    assert client.get("/v1/emails", headers=tenant.headers).get_json()["data"] == []


def test_send_with_template_ignores_html_and_text(app, client, tenant, config):
    template = create(client, tenant)
    body = email_body(
        template_id=template["id"],
        html="<p>ignored</p>",
        text="ignored",
        variables={"user": {"name": "Ann"}, "code": "7"},
    )
    email_id = post(
        client, tenant, **{k: v for k, v in body.items() if k not in ("from", "to", "subject")}
    )
    app.start()
    shown = wait_status(client, tenant, email_id, "sent")
    assert shown["subject"] == "Welcome, Ann" and shown["templateId"] == template["id"]
    [message] = list(mailbox.Maildir(config["outbox"]))
    plain, html = message.get_payload()
    assert plain.get_payload(decode=True).decode().strip() == "Hello Ann, your code is 7"
    assert (
        html.get_payload(decode=True).decode().strip() == "<p>Hello Ann, your code is <b>7</b></p>"
    )
    assert "ignored" not in message.as_string()


def test_template_without_subject_uses_the_request_subject(client, tenant):
    template = create(client, tenant, subject=None)
    template = client.put(
        f"/v1/templates/{template['id']}",
        json={"name": "n", "text": "Hi {{ name }}"},
        headers=tenant.headers,
    ).get_json()
    email_id = post(
        client,
        tenant,
        template_id=template["id"],
        variables={"name": "Bo"},
        text=None,
        subject="Plain subject",
    )
    shown = client.get(f"/v1/emails/{email_id}", headers=tenant.headers).get_json()
    assert shown["subject"] == "Plain subject"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"code": "1"}, "variables.user: missing"),
        ({"user": {}, "code": "1"}, "variables.user.name: missing"),
        ({"user": {"name": "A"}}, "variables.code: missing"),
        (
            {"user": {"name": "A\r\nBcc: victim@evil.test"}, "code": "1"},
            "subject: the rendered subject must not contain CR",
        ),
        ({"user": {"name": "A" * 300}, "code": "1"}, "subject: the rendered subject is over 255"),
    ],
)
def test_bad_variables_are_refused_and_cost_nothing(client, app, variables, message):
    tenant = make_tenant(app, credits=5)
    template = create(client, tenant)
    body = email_body(template_id=template["id"], text=None, variables=variables)
    assert_error(client.post("/v1/emails", json=body, headers=tenant.headers), 400, message)
    with app.store.read() as tx:
        assert tx.get_account(tenant.id).credits == 5
        assert sum(tx.count_emails_by_status().values()) == 0


def test_optional_variables_may_be_left_out(client, tenant):
    template = create(
        client,
        tenant,
        subject="Hi",
        html=None,
        text="{% if vip is defined %}VIP {% endif %}Hello {{ name | default('friend') }}",
    )
    rendered = client.post(
        f"/v1/templates/{template['id']}/render", json={}, headers=tenant.headers
    )
    assert rendered.get_json()["text"] == "Hello friend"


def test_the_sandbox_holds(client, tenant):
    template = create(client, tenant, subject="Hi", text="{{ ''.__class__.__mro__ }}", html=None)
    response = client.post(
        f"/v1/templates/{template['id']}/render", json={}, headers=tenant.headers
    )
    assert_error(response, 400, "text: the template could not be rendered")


def test_sending_keys_cannot_manage_templates(client, tenant, app):
    sending = {
        "Authorization": f"Bearer {operator.create_key(app.store, tenant.id, 'sending')['key']}"
    }
    assert_error(client.post("/v1/templates", json=WELCOME, headers=sending), 403)
    assert_error(client.get("/v1/templates", headers=sending), 403)


def test_templates_are_in_the_other_rate_limit_group(config, clock):
    config["rate_other_per_minute"] = 2
    app = create_app(config, clock=clock)
    tenant, client = make_tenant(app), Client(app)
    codes = [client.get("/v1/templates", headers=tenant.headers).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
