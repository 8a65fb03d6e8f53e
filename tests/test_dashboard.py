"""The dashboard's sessions, forms and isolation, through the real WSGI app on both backends:
cookies, CSRF and Origin, sign-out and revocation, lifetimes, the sign-in limit, escaping, and
another account's mail. (In a real browser, with axe-core: test_dashboard_browser.py.)"""

from __future__ import annotations

import re
from typing import Any

import pytest
from werkzeug.test import Client

from mailsvc import create_app, operator
from mailsvc.timestamps import iso_time

from .conftest import Tenant, email_body, make_tenant, wait_until

ORIGIN = {"Origin": "http://localhost"}
#: A request that came through the shipped nginx (on this machine).
PROXIED = {"REMOTE_ADDR": "127.0.0.1"}


def form_token(page: Any) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.get_data(as_text=True))
    assert found, page.get_data(as_text=True)[:500]
    return found.group(1)


def sign_in(client: Client, key: str, **headers: str) -> Any:
    """The sign-in form, then the key; with ``headers``, as through the proxy."""
    environ = PROXIED if headers else None
    form = client.get("/dashboard", headers=headers, environ_base=environ)
    return client.post(
        "/dashboard/sign-in",
        data={"key": key, "csrf_token": form_token(form)},
        headers={**ORIGIN, **headers},
        environ_base=environ,
    )


def signed_in(app, tenant: Tenant) -> Client:
    browser = Client(app)
    assert sign_in(browser, tenant.key).status_code == 303
    return browser


def send(app, tenant: Tenant, **fields: Any) -> str:
    response = Client(app).post("/v1/emails", json=email_body(**fields), headers=tenant.headers)
    assert response.status_code == 200, response.get_json()
    return response.get_json()["id"]


def test_sign_in_holds_a_random_session_id_in_a_strict_cookie_never_the_key(app, tenant):
    browser = Client(app)
    answered = sign_in(browser, tenant.key)
    assert answered.status_code == 303 and answered.headers["Location"] == "/dashboard/emails"
    [cookie] = [c for c in answered.headers.getlist("Set-Cookie") if "mailsvc_session=" in c]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    assert len(value) == 43 and value not in tenant.key and tenant.key not in cookie
    page = browser.get("/dashboard/emails")
    assert page.status_code == 200 and "Sign out" in page.get_data(as_text=True)


def test_over_https_behind_the_proxy_the_cookie_is_secure_and_host_only(app, tenant):
    https = {"X-Forwarded-Proto": "https"}
    browser = Client(app)
    form = browser.get("/dashboard", headers=https, environ_base=PROXIED)
    answered = browser.post(
        "/dashboard/sign-in",
        data={"key": tenant.key, "csrf_token": form_token(form)},
        headers={"Origin": "https://localhost", **https},
        environ_base=PROXIED,
    )
    [cookie] = [c for c in answered.headers.getlist("Set-Cookie") if "session=" in c]
    assert cookie.startswith("__Host-mailsvc_session=") and "Secure" in cookie
    assert browser.get("/dashboard/emails", headers=https, environ_base=PROXIED).status_code == 200
    # The same header from a client that is not the proxy is not believed.
    direct = sign_in(Client(app), tenant.key)
    assert all("Secure" not in c for c in direct.headers.getlist("Set-Cookie"))


def test_every_page_carries_the_security_headers(app, tenant):
    browser = signed_in(app, tenant)
    email_id = send(app, tenant)
    for path in (
        "/dashboard",
        "/dashboard/emails",
        f"/dashboard/emails/{email_id}",
        "/dashboard/x",
    ):
        page = browser.get(path)
        policy = page.headers["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, path
        assert "unsafe-inline" not in policy and "http" not in policy, path
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        assert page.headers["Referrer-Policy"] == "same-origin"
        assert page.mimetype == "text/html", path  # a page for people, errors too
    preview = browser.get(f"/dashboard/emails/{email_id}/preview")
    assert "sandbox" in preview.headers["Content-Security-Policy"]
    assert "default-src 'none'" in preview.headers["Content-Security-Policy"]


def test_a_form_without_its_token_or_from_another_origin_changes_nothing(app, tenant, clock):
    scheduled = send(app, tenant, scheduledAt=iso_time(clock() + 86400))
    browser = signed_in(app, tenant)
    token = form_token(browser.get(f"/dashboard/emails/{scheduled}"))
    cancel = f"/dashboard/emails/{scheduled}/cancel"
    for data, headers in [
        ({}, ORIGIN),  # no token
        ({"csrf_token": "0" * 64}, ORIGIN),  # a wrong one
        ({"csrf_token": token}, {"Origin": "https://evil.example"}),  # another site
        ({"csrf_token": token}, {}),  # no Origin
    ]:
        refused = browser.post(cancel, data=data, headers=headers)
        assert refused.status_code == 403 and refused.mimetype == "text/html"
        assert app.store.reads.get_email(tenant.id, scheduled).status == "scheduled"
    done = browser.post(cancel, data={"csrf_token": token}, headers=ORIGIN)
    assert done.status_code == 303
    assert app.store.reads.get_email(tenant.id, scheduled).status == "canceled"
    # Sign-in is a form too (login CSRF): without the token of its own page it is refused.
    refused = Client(app).post("/dashboard/sign-in", data={"key": tenant.key}, headers=ORIGIN)
    assert refused.status_code == 403


def test_sign_out_ends_the_session_on_the_server(app, tenant):
    browser = signed_in(app, tenant)
    cookie = browser.get_cookie("mailsvc_session")
    assert cookie is not None
    token = form_token(browser.get("/dashboard/emails"))
    assert (
        browser.post("/dashboard/sign-out", data={"csrf_token": token}, headers=ORIGIN).status_code
        == 303
    )
    replayed = Client(app)  # the old cookie, kept by someone
    replayed.set_cookie("mailsvc_session", cookie.value)
    gone = replayed.get("/dashboard/emails")
    assert gone.status_code == 303 and gone.headers["Location"] == "/dashboard"


def test_revoking_the_key_ends_every_session_it_opened(app, tenant):
    first, second = signed_in(app, tenant), signed_in(app, tenant)
    other = make_tenant(app, domain="other.test")
    operator.revoke_key(app.store, tenant.key_id)
    for browser in (first, second):
        assert browser.get("/dashboard/emails").status_code == 303
    assert signed_in(app, other).get("/dashboard/emails").status_code == 200
    refused = sign_in(Client(app), tenant.key)
    assert refused.status_code == 401 and "unknown or revoked" in refused.get_data(as_text=True)


def test_a_session_ends_when_idle_and_at_its_lifetime(config, clock):
    config.update(dashboard_idle_minutes=10, dashboard_lifetime_hours=1)
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)
    idle = signed_in(app, tenant)
    clock.advance(11 * 60)
    assert idle.get("/dashboard/emails").status_code == 303
    used = signed_in(app, tenant)
    for _ in range(6):  # used every 9 minutes: never idle, but an hour is its lifetime
        clock.advance(9 * 60)
        assert used.get("/dashboard/emails").status_code == 200
    clock.advance(9 * 60)
    assert used.get("/dashboard/emails").status_code == 303


def test_sign_in_attempts_are_limited_per_client_address(config, clock):
    config.update(dashboard_signins_per_minute=3)
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)
    for _ in range(3):
        assert sign_in(Client(app), "ms_" + "a" * 26 + "_" + "b" * 52).status_code == 401
    limited = sign_in(Client(app), tenant.key)  # even the right key: the address is spent
    assert limited.status_code == 429 and "Retry-After" in limited.headers
    assert "too many sign-in attempts" in limited.get_data(as_text=True)
    elsewhere = sign_in(Client(app), tenant.key, **{"X-Forwarded-For": "203.0.113.7"})
    assert elsewhere.status_code == 303  # another address behind the proxy has its own
    clock.advance(60)
    assert sign_in(Client(app), tenant.key).status_code == 303


def test_another_accounts_email_is_a_404_page(app, tenant):
    other = make_tenant(app, domain="other.test")
    theirs = send(app, other, **{"from": "Other <hello@other.test>"})
    browser = signed_in(app, tenant)
    for path in (f"/dashboard/emails/{theirs}", f"/dashboard/emails/{theirs}/preview"):
        page = browser.get(path)
        assert page.status_code == 404 and page.mimetype == "text/html", path
    listed = browser.get("/dashboard/emails").get_data(as_text=True)
    assert theirs not in listed


def test_what_tenants_wrote_is_escaped(app, tenant):
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'"
    email_id = send(
        app, tenant, subject=hostile, text=hostile, tags=[{"name": "t", "value": "x"}],
        headers={"X-Note": hostile},
    )  # fmt: skip
    browser = signed_in(app, tenant)
    for path in ("/dashboard/emails", f"/dashboard/emails/{email_id}"):
        html = browser.get(path).get_data(as_text=True)
        assert "<script>alert" not in html and "<img src=x" not in html, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, path


def test_filters_use_the_apis_query_names_and_its_errors(app, tenant):
    send(app, tenant, to="alice@example.org", tags=[{"name": "flow", "value": "reset"}])
    send(app, tenant, to="bob@example.org")
    browser = signed_in(app, tenant)
    page = browser.get("/dashboard/emails?to=alice@example.org&status=").get_data(as_text=True)
    assert "alice@example.org" in page and "bob@example.org" not in page
    page = browser.get("/dashboard/emails?tag=flow:reset").get_data(as_text=True)
    assert "alice@example.org" in page and "bob@example.org" not in page
    bad = browser.get("/dashboard/emails?tag=nonsense")
    assert bad.status_code == 400 and "tag: must be name:value" in bad.get_data(as_text=True)


def test_pages_are_paged_with_the_apis_cursor(app, tenant):
    for n in range(3):
        send(app, tenant, to=f"u{n}@example.org")
    browser = signed_in(app, tenant)
    first = browser.get("/dashboard/emails?limit=2").get_data(as_text=True)
    assert "u2@example.org" in first and "u1@example.org" in first and "u0@" not in first
    older = re.search(r'href="(/dashboard/emails\?[^"]+)" rel="next"', first)
    assert older
    second = browser.get(older.group(1).replace("&amp;", "&")).get_data(as_text=True)
    assert "u0@example.org" in second and "u2@" not in second


def test_a_dashboard_page_costs_what_the_api_request_costs(config, clock):
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)
    operator.set_limit(app.store, tenant.id, "list", 2)
    browser = signed_in(app, tenant)
    assert browser.get("/dashboard/emails").status_code == 200
    assert browser.get("/dashboard/emails").status_code == 200
    limited = browser.get("/dashboard/emails")  # the list bucket the API's GETs draw on
    assert limited.status_code == 429 and limited.mimetype == "text/html"
    api = Client(app).get("/v1/emails", headers=tenant.headers)
    assert api.status_code == 429


def test_an_operator_can_turn_it_off(config):
    config.update(dashboard=False)
    app = create_app(config)
    answered = Client(app).get("/dashboard")
    assert answered.status_code == 404 and answered.mimetype == "application/json"


@pytest.mark.parametrize("path", ["/dashboard/emails", "/dashboard/emails/em_x"])
def test_without_a_session_a_page_leads_to_sign_in(app, path):
    answered = Client(app).get(path)
    assert answered.status_code == 303 and answered.headers["Location"] == "/dashboard"


def test_keys_are_listed_created_with_the_secret_shown_once_and_revoked(app, tenant):
    browser = signed_in(app, tenant)
    page = browser.get("/dashboard/keys")
    token = form_token(page)
    made = browser.post(
        "/dashboard/keys", data={"name": "ci", "scope": "sending", "csrf_token": token},
        headers=ORIGIN,
    )  # fmt: skip
    html = made.get_data(as_text=True)
    secret = re.search(r"ms_[a-z2-7]{26}_[a-z2-7]{52}", html)
    assert made.status_code == 200 and secret and "shown this once" in html
    new_key = secret.group(0)
    assert (
        Client(app).get("/v1/account", headers={"Authorization": f"Bearer {new_key}"}).status_code
        == 403
    )  # sending scope
    again = browser.get("/dashboard/keys").get_data(as_text=True)
    assert new_key not in again and "ci" in again  # listed, never shown again
    bad = browser.post(
        "/dashboard/keys", data={"name": "x", "scope": "root", "csrf_token": token}, headers=ORIGIN
    )
    assert bad.status_code == 400 and "scope" in bad.get_data(as_text=True)
    key_id = "key_" + new_key.split("_")[1]
    revoked = browser.post(
        f"/dashboard/keys/{key_id}/revoke", data={"csrf_token": token}, headers=ORIGIN
    )
    assert revoked.status_code == 303
    assert (
        Client(app).get("/v1/emails", headers={"Authorization": f"Bearer {new_key}"}).status_code
        == 401
    )
    # Revoking the session's own key ends the session.
    own = browser.post(
        f"/dashboard/keys/{tenant.key_id}/revoke", data={"csrf_token": token}, headers=ORIGIN
    )
    assert own.headers["Location"] == "/dashboard"
    assert browser.get("/dashboard/keys").status_code == 303


def test_domains_show_their_records_and_are_checked_again(app, tenant):
    browser = signed_in(app, tenant)
    token = form_token(browser.get("/dashboard/domains"))
    added = browser.post(
        "/dashboard/domains", data={"name": "acme.example", "csrf_token": token}, headers=ORIGIN
    )
    assert added.status_code == 303
    page = browser.get("/dashboard/domains").get_data(as_text=True)
    assert "_mailsvc.acme.example" in page and "v=DKIM1; k=rsa; p=" in page
    assert page.count('data-copy="') >= 6  # name and value of each record, ready to copy
    domain_id = re.search(r'action="/dashboard/domains/(dom_[a-z0-9]+)/check"', page)
    assert domain_id
    checked = browser.post(
        f"/dashboard/domains/{domain_id.group(1)}/check", data={"csrf_token": token}, headers=ORIGIN
    )
    assert checked.status_code == 303  # (the DNS says what it says; the check ran)
    taken = browser.post(
        "/dashboard/domains", data={"name": "x", "csrf_token": token}, headers=ORIGIN
    )
    assert taken.status_code == 400 and "name" in taken.get_data(as_text=True)
    deleted = browser.post(
        f"/dashboard/domains/{domain_id.group(1)}/delete", data={"csrf_token": token},
        headers=ORIGIN,
    )  # fmt: skip
    assert deleted.status_code == 303
    assert "acme.example" not in browser.get("/dashboard/domains").get_data(as_text=True)


def test_the_account_page_shows_credit_and_the_last_14_days_as_a_chart_and_a_table(
    app, tenant, clock
):
    app.start()  # (delivery into the outbox)
    sent = send(app, tenant)
    wait_until(lambda: app.store.reads.get_email(tenant.id, sent).status == "sent", 30, "sent")
    send(app, tenant, scheduledAt=iso_time(clock() + 3600))  # scheduled: in no series
    page = signed_in(app, tenant).get("/dashboard/account").get_data(as_text=True)
    assert "<strong>998</strong>" in page and tenant.id in page
    assert page.count('<rect class="bar bar-') == 14 * 4  # four series, fourteen days
    assert 'role="img" aria-labelledby="chart-title"' in page
    today = str(iso_time(clock()))[:10]
    row = re.search(rf'<tr><th scope="row">{today}</th>(.*?)</tr>', page)
    assert row  # today's numbers, as a table: one sent, nothing failed, bounced, complained
    assert re.findall(r"<td>(\d+)</td>", row.group(1)) == ["1", "0", "0", "0"]


def test_suppressions_are_listed_added_and_removed(app, tenant):
    browser = signed_in(app, tenant)
    token = form_token(browser.get("/dashboard/suppressions"))
    form = {"address": "gone@example.org", "csrf_token": token}
    assert browser.post("/dashboard/suppressions", data=form, headers=ORIGIN).status_code == 303
    assert "gone@example.org" in browser.get("/dashboard/suppressions").get_data(as_text=True)
    assert app.store.reads.get_suppression(tenant.id, "gone@example.org") is not None
    bad = browser.post("/dashboard/suppressions", data={**form, "address": "nope"}, headers=ORIGIN)
    assert bad.status_code == 400 and "address" in bad.get_data(as_text=True)
    removed = browser.post("/dashboard/suppressions/delete", data=form, headers=ORIGIN)
    assert removed.status_code == 303
    assert app.store.reads.get_suppression(tenant.id, "gone@example.org") is None


def test_webhooks_are_created_with_their_secret_once_tested_and_deleted(config, clock):
    config.update(webhook_allow_http=True, webhook_allow_private=True)
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)
    browser = signed_in(app, tenant)
    token = form_token(browser.get("/dashboard/webhooks"))
    made = browser.post(
        "/dashboard/webhooks",
        data={"url": "http://127.0.0.1:9/hook", "events": ["email.sent", "email.bounced"],
              "csrf_token": token},
        headers=ORIGIN,
    )  # fmt: skip
    html = made.get_data(as_text=True)
    secret = re.search(r"whsec_[A-Za-z0-9+/=]+", html)
    assert made.status_code == 200 and secret and "shown this once" in html
    webhook_id = re.search(r'href="/dashboard/webhooks/(wh_[a-z0-9]+)"', html).group(1)
    assert secret.group(0) not in browser.get("/dashboard/webhooks").get_data(as_text=True)
    sent = browser.post(f"/dashboard/webhooks/{webhook_id}/test", data={"csrf_token": token},
                        headers=ORIGIN)  # fmt: skip
    assert sent.status_code == 303
    page = browser.get(f"/dashboard/webhooks/{webhook_id}").get_data(as_text=True)
    assert "webhook.test" in page and "email.sent" in page and "email.bounced" in page
    no_events = {"url": "http://127.0.0.1:9/x", "csrf_token": token}
    none = browser.post("/dashboard/webhooks", data=no_events, headers=ORIGIN)
    assert none.status_code == 400 and "events" in none.get_data(as_text=True)
    changed = browser.post(
        f"/dashboard/webhooks/{webhook_id}",
        data={"url": "http://127.0.0.1:9/other", "events": ["email.failed"],
              "status": "disabled", "csrf_token": token},
        headers=ORIGIN,
    )  # fmt: skip
    assert changed.status_code == 303
    shown = Client(app).get(f"/v1/webhooks/{webhook_id}", headers=tenant.headers).get_json()
    assert (shown["url"], shown["events"], shown["status"]) == (
        "http://127.0.0.1:9/other",
        ["email.failed"],
        "disabled",
    )
    refused = browser.post(
        f"/dashboard/webhooks/{webhook_id}",
        data={"url": "http://127.0.0.1:9/other", "csrf_token": token}, headers=ORIGIN,
    )  # fmt: skip
    assert refused.status_code == 400 and "events" in refused.get_data(as_text=True)
    gone = browser.post(f"/dashboard/webhooks/{webhook_id}/delete", data={"csrf_token": token},
                        headers=ORIGIN)  # fmt: skip
    assert gone.status_code == 303
    assert browser.get(f"/dashboard/webhooks/{webhook_id}").status_code == 404


def test_a_failed_webhook_delivery_is_sent_again_from_its_page(config, clock, receiver):
    from .webhook_receiver import Answer

    config.update(webhook_allow_http=True, webhook_allow_private=True,
                  webhook_retry_seconds="0.1")  # fmt: skip
    app = create_app(config, clock=clock)
    tenant = make_tenant(app)
    app.start()
    try:
        receiver.answer = lambda delivery: Answer(500)
        made = Client(app).post("/v1/webhooks", headers=tenant.headers,
                                json={"url": receiver.url(), "events": ["email.sent"]})  # fmt: skip
        webhook_id = made.get_json()["id"]
        browser = signed_in(app, tenant)
        token = form_token(browser.get("/dashboard/webhooks"))
        browser.post(f"/dashboard/webhooks/{webhook_id}/test", data={"csrf_token": token},
                     headers=ORIGIN)  # fmt: skip
        page = f"/dashboard/webhooks/{webhook_id}"
        wait_until(lambda: "Send again" in browser.get(page).get_data(as_text=True), 10, "failed")
        html = browser.get(page).get_data(as_text=True)
        resend = re.search(
            r'action="(/dashboard/webhooks/[^"]+/deliveries/(msg_\w+)/resend)"', html
        )
        assert resend and len(receiver.received) == 2  # the first attempt, and one retry
        receiver.answer = lambda delivery: Answer(200)
        forged = browser.post(resend.group(1), data={"csrf_token": "x"}, headers=ORIGIN)
        assert forged.status_code == 403
        sent = browser.post(resend.group(1), data={"csrf_token": token}, headers=ORIGIN)
        assert sent.status_code == 303 and sent.headers["Location"].endswith(resend.group(2))
        receiver.wait_for(3, timeout=10)
        assert receiver.received[-1].headers["webhook-id"] == resend.group(2)
        wait_until(lambda: "succeeded" in browser.get(page).get_data(as_text=True), 10, "sent")
        # Another account's session cannot send it again.
        other = signed_in(app, make_tenant(app, domain=None))
        theirs = other.post(resend.group(1), data={"csrf_token": form_token(other.get(
            "/dashboard/webhooks"))}, headers=ORIGIN)  # fmt: skip
        assert theirs.status_code == 404
    finally:
        app.stop(timeout=5)


def test_templates_are_listed_created_escaped_and_deleted(app, tenant):
    browser = signed_in(app, tenant)
    token = form_token(browser.get("/dashboard/templates"))
    made = browser.post(
        "/dashboard/templates",
        data={"name": "<b>welcome</b>", "subject": "Hi {{ name }} <script>x</script>",
              "text": "Hello", "csrf_token": token},
        headers=ORIGIN,
    )  # fmt: skip
    assert made.status_code == 303
    page = browser.get("/dashboard/templates").get_data(as_text=True)
    assert "&lt;b&gt;welcome&lt;/b&gt;" in page and "<script>x" not in page
    template_id = re.search(r'action="/dashboard/templates/(tpl_[a-z0-9]+)/delete"', page).group(1)
    bad = browser.post(
        "/dashboard/templates", data={"name": "", "csrf_token": token}, headers=ORIGIN
    )
    assert bad.status_code == 400 and "name" in bad.get_data(as_text=True)
    assert browser.post(f"/dashboard/templates/{template_id}/delete", data={"csrf_token": token},
                        headers=ORIGIN).status_code == 303  # fmt: skip
    assert template_id not in browser.get("/dashboard/templates").get_data(as_text=True)


def test_a_scheduled_email_is_moved_to_another_time(app, tenant, clock):
    scheduled = send(app, tenant, scheduledAt=iso_time(clock() + 86400))
    browser = signed_in(app, tenant)
    token = form_token(browser.get(f"/dashboard/emails/{scheduled}"))
    later = str(iso_time(clock() + 2 * 86400))[:16]  # as a datetime-local input sends it
    path = f"/dashboard/emails/{scheduled}/reschedule"
    moved = browser.post(path, data={"scheduledAt": later, "csrf_token": token}, headers=ORIGIN)
    assert moved.status_code == 303
    shown = Client(app).get(f"/v1/emails/{scheduled}", headers=tenant.headers).get_json()
    assert shown["scheduledAt"].startswith(later)
    too_far = str(iso_time(clock() + 90 * 86400))[:16]
    refused = browser.post(path, data={"scheduledAt": too_far, "csrf_token": token}, headers=ORIGIN)
    assert refused.status_code == 400 and "at most 30 days ahead" in refused.get_data(as_text=True)


def test_a_template_is_edited_and_its_source_shown_inert(app, tenant):
    made = Client(app).post(
        "/v1/templates", json={"name": "welcome", "subject": "Hi", "html": "<p>{{ name }}</p>"},
        headers=tenant.headers,
    ).get_json()  # fmt: skip
    browser = signed_in(app, tenant)
    page = browser.get(f"/dashboard/templates/{made['id']}")
    assert "&lt;p&gt;{{ name }}&lt;/p&gt;</textarea>" in page.get_data(as_text=True)
    token = form_token(page)
    edited = {"name": "welcome", "subject": "Hello {{ name }}", "html": "<b>{{ name }}</b>",
              "csrf_token": token}  # fmt: skip
    saved = browser.post(f"/dashboard/templates/{made['id']}", data=edited, headers=ORIGIN)
    assert saved.status_code == 303
    shown = Client(app).get(f"/v1/templates/{made['id']}", headers=tenant.headers).get_json()
    assert (shown["subject"], shown["html"]) == ("Hello {{ name }}", "<b>{{ name }}</b>")
    broken = {**edited, "html": "{% for %}"}
    refused = browser.post(f"/dashboard/templates/{made['id']}", data=broken, headers=ORIGIN)
    assert refused.status_code == 400 and "html" in refused.get_data(as_text=True)
    assert "{% for %}" in refused.get_data(as_text=True)  # what was sent, shown again


def test_a_page_notes_its_session_in_the_store_at_most_every_30_seconds(app, tenant, clock):
    browser = signed_in(app, tenant)
    assert browser.get("/dashboard/account").status_code == 200  # (the process's keys load)
    jobs: list[int] = []
    app.store.on_commit = lambda waits, held: jobs.append(len(waits))
    for _ in range(5):
        assert browser.get("/dashboard/account").status_code == 200
    writes = sum(jobs)
    assert writes == 5  # the rate-limit token of each page, and nothing for the session
    clock.advance(31)
    assert browser.get("/dashboard/account").status_code == 200
    assert sum(jobs) == writes + 2  # its token, and the session seen again


def test_a_form_larger_than_the_body_limit_is_refused_before_it_is_read(app, tenant):
    browser = Client(app)
    token = form_token(browser.get("/dashboard"))
    flood = {"key": "x" * 2_000_000, "csrf_token": token}
    refused = browser.post("/dashboard/sign-in", data=flood, headers=ORIGIN)
    assert refused.status_code == 413 and refused.mimetype == "text/html"
    assert browser.get_cookie("mailsvc_session") is None
