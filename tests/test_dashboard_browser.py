"""The dashboard in a real browser: Debian's Chromium driven by Playwright, against real gunicorn
processes. A person signs in, finds an email, opens it, cancels a scheduled one and signs out;
what tenants wrote runs nowhere (no dialog, no request to another origin); axe-core (from the
npm registry, ``MAILSVC_AXE_JS`` or ``.ci/node_modules``) finds nothing serious or critical on
any page, in the light scheme or the dark. With ``MAILSVC_SCREENSHOTS=DIR`` each page is saved
there, light and dark (docs/ has them)."""

from __future__ import annotations

import http.server
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mailsvc import operator
from mailsvc.store import open_store
from mailsvc.timestamps import iso_time

from .conftest import VERIFIED, email_body
from .servers import ROOT, Gunicorn, free_port, request

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
AXE = Path(os.environ.get("MAILSVC_AXE_JS", ROOT / ".ci" / "node_modules/axe-core/axe.min.js"))
HOSTILE = '<script>alert("subject")</script><img src=x onerror=alert("img")>'


class Pixel(http.server.ThreadingHTTPServer):
    """Another origin on loopback that counts the requests it gets (a remote image's)."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.hits.append(self.path)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("dashboard")
    database = str(folder / "mailsvc.sqlite3")
    store = open_store(database)
    account = operator.create_account(store, "Acme", 100)
    key = operator.create_key(store, account["id"])["key"]
    operator.add_domain(store, account["id"], VERIFIED, verified=True)
    store.shutdown()
    pixel = Pixel()
    server = Gunicorn(
        {
            "MAILSVC_DATABASE": database,
            "MAILSVC_OUTBOX": str(folder / "outbox"),
            "MAILSVC_STORE_MIN_FREE_MB": "0",
            "MAILSVC_WEBHOOK_ALLOW_HTTP": "true",
            "MAILSVC_WEBHOOK_ALLOW_PRIVATE": "true",
            "MAILSVC_WEBHOOK_RETRY_SECONDS": "0.1",  # its test event fails at once: sent again
        },
        workers=1,
    ).start()
    headers = {"Authorization": f"Bearer {key}"}
    hostile_html = (
        f'<p>Hello</p><script>document.title="ran"</script>'
        f'<img src="http://127.0.0.1:{pixel.server_port}/pixel.png" alt="">'
        f'<form action="http://127.0.0.1:{pixel.server_port}/form"><button>Go</button></form>'
    )
    status, made = server.request(
        "POST", "/v1/webhooks",
        {"url": "http://127.0.0.1:9/hooks/mail", "events": ["email.sent"]}, headers,
    )  # fmt: skip
    assert status == 201, made
    server.request("POST", f"/v1/webhooks/{made['id']}/test", None, headers)
    server.request("POST", "/v1/suppressions", {"address": "gone@example.org"}, headers)
    template = {"name": "welcome", "subject": "Welcome, {{ name }}", "text": "Hi {{ name }}"}
    _, made_template = server.request("POST", "/v1/templates", template, headers)
    ids = {}
    for name, fields in {
        "receipt": {"to": "alice@example.org", "subject": "Your receipt",
                    "tags": [{"name": "flow", "value": "receipt"}]},
        "hostile": {"to": "mallory@example.org", "subject": HOSTILE, "html": hostile_html,
                    "text": HOSTILE},
        "scheduled": {"to": "later@example.org", "subject": "Later",
                      "scheduledAt": iso_time(time.time() + 86400)},
    }.items():  # fmt: skip
        status, body = server.request("POST", "/v1/emails", email_body(**fields), headers)
        assert status == 200, body
        ids[name] = body["id"]
    try:
        yield {"url": f"http://127.0.0.1:{server.port}", "key": key, "ids": ids, "pixel": pixel,
               "webhook": made["id"], "template": made_template["id"]}  # fmt: skip
    finally:
        pixel.shutdown()
        pixel.server_close()
        assert "Traceback" not in server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        _missing("Chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def _missing(why: str) -> None:
    """Without the browser or axe-core these tests are skipped, saying why; under CI they
    fail (CI installs both), as the PostgreSQL half of the suite does."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def new_page(browser: Any, scheme: str = "light") -> Any:
    context = browser.new_context(color_scheme=scheme)
    page = context.new_page()
    page.dialogs = []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    return page


def sign_in(page: Any, served: dict[str, Any]) -> None:
    page.goto(served["url"] + "/dashboard")
    page.get_by_label("API key").fill(served["key"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/dashboard/emails")


def axe_findings(page: Any) -> list[str]:
    """axe-core's serious and critical findings on the page as it is now."""
    if not AXE.exists():
        _missing(f"axe-core is not at {AXE} (npm install --prefix .ci axe-core@4)")
    page.evaluate(AXE.read_text())  # (evaluated by the browser's debugger: no CSP applies)
    result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [
        f"{v['id']}: {v['help']} ({len(v['nodes'])} nodes)"
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def test_a_person_finds_an_email_opens_it_cancels_one_and_signs_out(browser, served):
    page = new_page(browser)
    sign_in(page, served)
    rows = page.locator("tbody tr")
    assert rows.count() == 3
    page.get_by_label("Recipient").fill("alice@example.org")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/dashboard/emails?*to=alice%40example.org*")  # (the list filtered, loaded)
    assert page.locator("tbody tr").count() == 1
    page.get_by_role("link", name="Your receipt").click()
    page.wait_for_url(f"**/dashboard/emails/{served['ids']['receipt']}")
    assert page.get_by_role("heading", level=1).inner_text() == "Your receipt"
    assert page.locator("dl.facts").get_by_text("flow:receipt").count() == 1
    assert page.get_by_role("heading", name="Timeline").count() == 1

    page.goto(served["url"] + f"/dashboard/emails/{served['ids']['scheduled']}")
    page.get_by_role("button", name="Cancel this email").click()
    page.wait_for_url(f"**/dashboard/emails/{served['ids']['scheduled']}")
    assert page.locator(".status").first.inner_text() == "canceled"

    cookies = page.context.cookies()
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/dashboard")
    replay = browser.new_context()
    replay.add_cookies([c for c in cookies if c["name"] == "mailsvc_session"])
    again = replay.new_page()
    again.goto(served["url"] + "/dashboard/emails")
    assert again.url.endswith("/dashboard")  # the old session no longer opens anything
    replay.close()
    assert page.dialogs == []


def test_what_a_tenant_wrote_runs_nowhere_and_fetches_nothing(browser, served):
    page = new_page(browser)
    sign_in(page, served)
    hostile = served["ids"]["hostile"]
    page.goto(served["url"] + f"/dashboard/emails/{hostile}")
    assert page.get_by_role("heading", level=1).inner_text() == HOSTILE  # shown as text
    frame = page.frame_locator("iframe")
    assert frame.get_by_text("Hello").inner_text() == "Hello"  # the preview renders
    assert page.locator("iframe").get_attribute("sandbox") == ""  # no allow-* at all
    page.wait_for_load_state("load")  # the frame and whatever it could fetch, done
    [preview] = [frame for frame in page.frames if frame.url.endswith("/preview")]
    assert preview.evaluate("document.title") != "ran"  # its script did not run
    assert served["pixel"].hits == []  # no request to another origin
    assert page.dialogs == []
    page.goto(served["url"] + "/dashboard/emails")
    assert page.get_by_text(HOSTILE).count() == 1 and page.dialogs == []


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_page_has_no_serious_accessibility_finding(browser, served, scheme):
    page = new_page(browser, scheme)
    shots = os.environ.get("MAILSVC_SCREENSHOTS")
    pages = {
        "sign-in": "/dashboard",
        "emails": "/dashboard/emails",
        "email": f"/dashboard/emails/{served['ids']['receipt']}",
        "domains": "/dashboard/domains",
        "keys": "/dashboard/keys",
        "webhooks": "/dashboard/webhooks",
        "webhook": f"/dashboard/webhooks/{served['webhook']}",
        "suppressions": "/dashboard/suppressions",
        "templates": "/dashboard/templates",
        "template": f"/dashboard/templates/{served['template']}",
        "account": "/dashboard/account",
        "not-found": "/dashboard/emails/em_nothing",
    }
    findings = {}
    for name, path in pages.items():
        if name == "emails":
            sign_in(page, served)
        page.goto(served["url"] + path)
        findings[name] = axe_findings(page)
        if shots:
            page.screenshot(
                path=str(Path(shots) / f"dashboard-{name}-{scheme}.png"), full_page=True
            )
    assert findings == {name: [] for name in pages}


def test_a_key_is_created_copied_once_and_revoked_in_the_browser(browser, served):
    page = new_page(browser)
    sign_in(page, served)
    page.get_by_role("link", name="API keys").click()
    page.get_by_label("Name").fill("deploy")
    page.get_by_role("button", name="Create a key").click()
    secret = page.locator(".created code").inner_text()
    assert secret.startswith("ms_") and len(secret) == 82
    page.get_by_role("link", name="API keys").click()  # shown once: not on the next visit
    assert page.locator(".created").count() == 0 and secret not in page.content()
    page.get_by_role("button", name="Revoke deploy").click()
    page.wait_for_url("**/dashboard/keys")
    port = int(served["url"].rsplit(":", 1)[1])
    status, _ = request(port, "GET", "/v1/emails", headers={"Authorization": f"Bearer {secret}"})
    assert status == 401  # revoked
    assert page.dialogs == []
