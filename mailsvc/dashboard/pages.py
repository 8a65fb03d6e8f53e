"""The dashboard's pages: each asks the API's own path (``MailService.act``) with the session's
key, and renders what it answers."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from importlib import resources
from typing import Any, Protocol

from werkzeug.exceptions import NotFound
from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from .. import statuses
from ..errors import NotAuthenticated, RateLimited, ValidationFailed
from ..http.auth import authenticate, key_token
from ..routes import (
    CANCEL_EMAIL,
    CREATE_DOMAIN,
    CREATE_KEY,
    CREATE_SUPPRESSION,
    CREATE_TEMPLATE,
    CREATE_WEBHOOK,
    DELETE_DOMAIN,
    DELETE_SUPPRESSION,
    DELETE_TEMPLATE,
    DELETE_WEBHOOK,
    GET_ACCOUNT,
    GET_EMAIL,
    GET_TEMPLATE,
    GET_WEBHOOK,
    LIST_DOMAINS,
    LIST_EMAILS,
    LIST_KEYS,
    LIST_SUPPRESSIONS,
    LIST_TEMPLATES,
    LIST_WEBHOOK_DELIVERIES,
    LIST_WEBHOOKS,
    RESCHEDULE_EMAIL,
    REVOKE_KEY,
    TEST_WEBHOOK,
    UPDATE_TEMPLATE,
    UPDATE_WEBHOOK,
    VERIFY_DOMAIN,
)
from ..settings import Settings
from ..store import TokenExhausted
from ..timestamps import iso_time
from . import security, sessions
from .sessions import SignedIn


class Dashboard(Protocol):
    """What a page uses of the dashboard (``site.Dashboard``)."""

    service: Any  # the service (``site.Service``): its store, clock and the API's path
    settings: Settings

    def session(self, request: Request) -> SignedIn | None: ...

    def cookie_name(self, request: Request) -> str: ...

    def render(self, name: str, status: int = 200, **context: Any) -> Response: ...


#: The cookie that ties the sign-in form to the browser that loaded it (login CSRF).
SIGN_IN_COOKIE = "mailsvc_signin"
#: The rate-limit bucket of sign-in attempts, per client address.
SIGN_IN_GROUP = "dashboard_signin"
#: The statuses a list may be filtered by (those of ``GET /v1/emails?status=``).
EMAIL_STATUSES = (
    statuses.SCHEDULED, statuses.QUEUED, statuses.SENDING, statuses.DEFERRED, statuses.SENT,
    statuses.PARTIALLY_SENT, statuses.FAILED, statuses.CANCELED, statuses.BOUNCED,
)  # fmt: skip
_STATIC = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript"}


def _sign_in_token(nonce: str) -> str:
    return hmac.new(nonce.encode(), b"mailsvc dashboard sign-in", hashlib.sha256).hexdigest()


def _set_cookie(dash: Dashboard, request: Request, response: Response, name: str, value: str,
                path: str = "/", max_age: int | None = None) -> None:  # fmt: skip
    response.set_cookie(
        name, value, max_age=max_age, path=path, secure=security.over_https(request),
        httponly=True, samesite="Strict",
    )  # fmt: skip


def to_sign_in(dash: Dashboard, request: Request) -> Response:
    return redirect("/dashboard", 303)


def sign_in_form(dash: Dashboard, request: Request, problem: str | None = None,
                 status: int = 200) -> Response:  # fmt: skip
    if problem is None and dash.session(request) is not None:
        return redirect("/dashboard/emails", 303)
    nonce = secrets.token_urlsafe(32)
    response = dash.render(
        "sign_in.html", status=status, signed_in=None, csrf_token=_sign_in_token(nonce),
        problem=problem, idle_minutes=round(dash.settings.dashboard_idle_minutes),
    )  # fmt: skip
    _set_cookie(dash, request, response, SIGN_IN_COOKIE, nonce, path="/dashboard")
    return response


def sign_in(dash: Dashboard, request: Request) -> Response:
    service, settings = dash.service, dash.settings
    nonce = request.cookies.get(SIGN_IN_COOKIE, "")
    security.check_form(request, _sign_in_token(nonce) if nonce else "-")
    now = service.clock()
    per_minute = settings.dashboard_signins_per_minute
    address = security.client_address(request)
    try:  # every attempt counts, on every worker and host, before the key is looked at
        service.store.write(
            lambda tx: tx.spend_token(f"address:{address}", SIGN_IN_GROUP, per_minute, now)
        )
    except TokenExhausted:
        raise RateLimited(
            f"too many sign-in attempts from your address: at most {per_minute} a minute",
            60 / per_minute,
        ) from None
    token = key_token(request.form.get("key", "").strip())
    if token is None:
        return sign_in_form(dash, request, "That is not an API key (they begin with ms_).", 401)
    try:
        principal, _ = authenticate(token, service.store.reads, "other")
    except NotAuthenticated:
        return sign_in_form(dash, request, "That API key is unknown or revoked.", 401)
    session_id = sessions.new_session_id()
    hashed = sessions.id_hash(session_id)
    idle = settings.dashboard_idle_minutes * 60
    service.store.write(
        lambda tx: tx.open_dashboard_session(
            hashed, principal.account_id, principal.key_id, now, idle
        )
    )
    response = redirect("/dashboard/emails", 303)
    lifetime = int(settings.dashboard_lifetime_hours * 3600)
    _set_cookie(dash, request, response, dash.cookie_name(request), sessions.encode(session_id),
                max_age=lifetime)  # fmt: skip
    response.delete_cookie(SIGN_IN_COOKIE, path="/dashboard")
    return response


def sign_out(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    security.check_form(request, signed_in.csrf_token)
    hashed = sessions.id_hash(signed_in.session_id)
    dash.service.store.write(lambda tx: tx.end_dashboard_session(hashed))
    response = redirect("/dashboard", 303)
    response.delete_cookie(dash.cookie_name(request), path="/", secure=security.over_https(request),
                           httponly=True, samesite="Strict")  # fmt: skip
    return response


def emails(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    repeated = [name for name, values in request.args.lists() if len(values) > 1]
    query = {name: value for name, value in request.args.items() if value.strip()}
    filters = {name: query.get(name, "") for name in ("status", "to", "tag")}
    try:
        if repeated:
            raise ValidationFailed(f"{repeated[0]}: given more than once")
        page = dash.service.act(signed_in.record.key_id, LIST_EMAILS, query=query)
        problem, status = None, 200
    except ValidationFailed as exc:
        page, problem, status = {"data": [], "hasMore": False, "nextCursor": None}, exc.message, 400
    older = None
    if page["nextCursor"]:
        older = {**{k: v for k, v in filters.items() if v}, "cursor": page["nextCursor"]}
    return dash.render(
        "emails.html", status=status, signed_in=signed_in, page=page, filters=filters,
        statuses=EMAIL_STATUSES, problem=problem, older=older,
    )  # fmt: skip


def _email(dash: Dashboard, signed_in: SignedIn, email_id: str) -> dict[str, Any]:
    return dash.service.act(signed_in.record.key_id, GET_EMAIL, {"email_id": email_id})


def email(dash: Dashboard, request: Request, signed_in: SignedIn, email_id: str,
          problem: str | None = None, status: int = 200) -> Response:  # fmt: skip
    shown = _email(dash, signed_in, email_id)
    record = dash.service.store.reads.get_email(signed_in.record.account_id, email_id)
    text = record.text if record is not None else None
    has_html = bool(record is not None and record.html)
    return dash.render(
        "email.html", status=status, signed_in=signed_in, email=shown, text=text,
        has_html=has_html, problem=problem,
    )  # fmt: skip


def preview(dash: Dashboard, request: Request, signed_in: SignedIn, email_id: str) -> Response:
    """The email's HTML alone, for the sandboxed frame of its page (served with a policy that
    lets it run nothing and fetch nothing)."""
    _email(dash, signed_in, email_id)  # the API's checks: the account's own email, a token
    record = dash.service.store.reads.get_email(signed_in.record.account_id, email_id)
    html = record.html if record is not None and record.html else "<p>(no HTML part)</p>"
    return Response(html, content_type="text/html; charset=utf-8")


def reschedule(dash: Dashboard, request: Request, signed_in: SignedIn, email_id: str) -> Response:
    """Move a scheduled email: the form's time is UTC (``datetime-local`` has no offset)."""
    security.check_form(request, signed_in.csrf_token)
    when = request.form.get("scheduledAt", "").strip()
    at = f"{when}:00Z" if re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d", when) else when
    try:
        dash.service.act(signed_in.record.key_id, RESCHEDULE_EMAIL, {"email_id": email_id},
                         body={"scheduledAt": at})  # fmt: skip
    except ValidationFailed as exc:
        return email(dash, request, signed_in, email_id, problem=exc.message, status=400)
    return redirect(f"/dashboard/emails/{email_id}", 303)


def cancel(dash: Dashboard, request: Request, signed_in: SignedIn, email_id: str) -> Response:
    security.check_form(request, signed_in.csrf_token)
    dash.service.act(signed_in.record.key_id, CANCEL_EMAIL, {"email_id": email_id})
    return redirect(f"/dashboard/emails/{email_id}", 303)


def static(dash: Dashboard, request: Request, name: str) -> Response:
    if name not in _STATIC:
        raise NotFound()
    body = resources.files("mailsvc.dashboard").joinpath("static", name).read_bytes()
    return Response(body, content_type=_STATIC[name])


# -- domains, keys, the account ----------------------------------------------------------------


def _form(request: Request, *names: str) -> dict[str, str]:
    """The named fields a form filled in (an empty one is absent, as an unset API field)."""
    return {
        name: request.form[name].strip() for name in names if request.form.get(name, "").strip()
    }


def _refused_or(dash: Dashboard, request: Request, signed_in: SignedIn, page: Any,
                change: Any) -> Response:  # fmt: skip
    """Do ``change``; a refusal of the input shows the page again with the API's message."""
    security.check_form(request, signed_in.csrf_token)
    try:
        return change()
    except ValidationFailed as exc:
        return page(dash, request, signed_in, problem=exc.message, status=400)


def domains(dash: Dashboard, request: Request, signed_in: SignedIn, problem: str | None = None,
            status: int = 200) -> Response:  # fmt: skip
    listed = dash.service.act(signed_in.record.key_id, LIST_DOMAINS, query={"limit": "100"})
    return dash.render("domains.html", status=status, signed_in=signed_in, domains=listed["data"],
                       problem=problem)  # fmt: skip


def add_domain(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        body = _form(request, "name")
        dash.service.act(signed_in.record.key_id, CREATE_DOMAIN, body=body)
        return redirect("/dashboard/domains", 303)

    return _refused_or(dash, request, signed_in, domains, change)


def check_domain(
    dash: Dashboard, request: Request, signed_in: SignedIn, domain_id: str
) -> Response:
    security.check_form(request, signed_in.csrf_token)
    dash.service.act(signed_in.record.key_id, VERIFY_DOMAIN, {"domain_id": domain_id})
    return redirect(f"/dashboard/domains#{domain_id}", 303)


def delete_domain(
    dash: Dashboard, request: Request, signed_in: SignedIn, domain_id: str
) -> Response:
    security.check_form(request, signed_in.csrf_token)
    dash.service.act(signed_in.record.key_id, DELETE_DOMAIN, {"domain_id": domain_id})
    return redirect("/dashboard/domains", 303)


def keys(dash: Dashboard, request: Request, signed_in: SignedIn, problem: str | None = None,
         status: int = 200, created: dict[str, Any] | None = None) -> Response:  # fmt: skip
    listed = dash.service.act(signed_in.record.key_id, LIST_KEYS, query={"limit": "100"})
    return dash.render("keys.html", status=status, signed_in=signed_in, keys=listed["data"],
                       problem=problem, created=created)  # fmt: skip


def create_key(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        body = _form(request, "name", "scope", "domain")
        made = dash.service.act(signed_in.record.key_id, CREATE_KEY, body=body)
        # Its secret is in this answer only (never stored, never in a redirect or a URL).
        return keys(dash, request, signed_in, created=made)

    return _refused_or(dash, request, signed_in, keys, change)


def revoke_key(dash: Dashboard, request: Request, signed_in: SignedIn, key_id: str) -> Response:
    security.check_form(request, signed_in.csrf_token)
    dash.service.act(signed_in.record.key_id, REVOKE_KEY, {"key_id": key_id})
    if key_id == signed_in.record.key_id:  # this session's own key: the session ended with it
        return redirect("/dashboard", 303)
    return redirect("/dashboard/keys", 303)


#: The chart's series: a name, and the statuses of the emails it counts.
SERIES = (
    ("sent", (statuses.SENT, statuses.PARTIALLY_SENT)),
    ("failed", (statuses.FAILED,)),
    ("bounced", (statuses.BOUNCED,)),
    ("complained", (statuses.COMPLAINED,)),
)
CHART_DAYS = 14


def account(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    shown = dash.service.act(signed_in.record.key_id, GET_ACCOUNT)
    today = int(dash.service.clock() // 86400) * 86400
    since = today - 86400 * (CHART_DAYS - 1)
    counted = dash.service.store.reads.daily_outcomes(shown["id"], since, CHART_DAYS)
    days = [
        {
            "date": str(iso_time(since + 86400 * number))[:10],
            **{name: sum(day.get(s, 0) for s in kinds) for name, kinds in SERIES},
        }
        for number, day in enumerate(counted)
    ]
    return dash.render("account.html", signed_in=signed_in, account=shown, days=days,
                       chart=_chart(days))  # fmt: skip


def _chart(days: list[dict[str, Any]]) -> dict[str, Any]:
    """The bars of the chart, drawn on the server: a group of four a day, to scale."""
    width, height, group = 700, 180, 50
    top = max([1] + [day[name] for day in days for name, _ in SERIES])
    bars = []
    for number, day in enumerate(days):
        for index, (name, _) in enumerate(SERIES):
            tall = round(day[name] / top * (height - 30), 1)
            x = 10 + number * group + index * 10
            bars.append({"x": x, "y": height - 20 - tall, "height": tall, "series": name,
                         "label": f"{day['date']}: {day[name]} {name}"})  # fmt: skip
    labels = [
        {"x": 10 + number * group, "text": day["date"][5:]} for number, day in enumerate(days)
    ]
    return {"width": width, "height": height, "bars": bars, "labels": labels, "top": top,
            "series": [name for name, _ in SERIES]}  # fmt: skip


# -- suppressions, webhooks, templates ---------------------------------------------------------

#: The events a webhook may subscribe to (those of ``POST /v1/webhooks``).
WEBHOOK_EVENTS = (
    "email.sent", "email.deferred", "email.failed", "email.bounced", "email.complained",
    "email.suppressed", "email.scheduled", "email.canceled",
)  # fmt: skip


def suppressions(dash: Dashboard, request: Request, signed_in: SignedIn,
                 problem: str | None = None, status: int = 200) -> Response:  # fmt: skip
    listed = dash.service.act(signed_in.record.key_id, LIST_SUPPRESSIONS, query={"limit": "100"})
    return dash.render("suppressions.html", status=status, signed_in=signed_in,
                       suppressions=listed["data"], problem=problem)  # fmt: skip


def add_suppression(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        body = _form(request, "address")
        dash.service.act(signed_in.record.key_id, CREATE_SUPPRESSION, body=body)
        return redirect("/dashboard/suppressions", 303)

    return _refused_or(dash, request, signed_in, suppressions, change)


def delete_suppression(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        address = request.form.get("address", "")
        dash.service.act(signed_in.record.key_id, DELETE_SUPPRESSION, {"address": address})
        return redirect("/dashboard/suppressions", 303)

    return _refused_or(dash, request, signed_in, suppressions, change)


def webhooks(dash: Dashboard, request: Request, signed_in: SignedIn, problem: str | None = None,
             status: int = 200, created: dict[str, Any] | None = None) -> Response:  # fmt: skip
    listed = dash.service.act(signed_in.record.key_id, LIST_WEBHOOKS, query={"limit": "100"})
    return dash.render("webhooks.html", status=status, signed_in=signed_in,
                       webhooks=listed["data"], events=WEBHOOK_EVENTS, problem=problem,
                       created=created)  # fmt: skip


def create_webhook(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        body: dict[str, Any] = _form(request, "url")
        body["events"] = request.form.getlist("events")
        made = dash.service.act(signed_in.record.key_id, CREATE_WEBHOOK, body=body)
        return webhooks(dash, request, signed_in, created=made)  # its secret, this once

    return _refused_or(dash, request, signed_in, webhooks, change)


def webhook(dash: Dashboard, request: Request, signed_in: SignedIn, webhook_id: str,
            problem: str | None = None, status: int = 200) -> Response:  # fmt: skip
    key_id, matched = signed_in.record.key_id, {"webhook_id": webhook_id}
    shown = dash.service.act(key_id, GET_WEBHOOK, matched)
    deliveries = dash.service.act(key_id, LIST_WEBHOOK_DELIVERIES, matched, query={"limit": "25"})
    return dash.render("webhook.html", status=status, signed_in=signed_in, webhook=shown,
                       deliveries=deliveries["data"], events=WEBHOOK_EVENTS,
                       problem=problem)  # fmt: skip


def update_webhook(
    dash: Dashboard, request: Request, signed_in: SignedIn, webhook_id: str
) -> Response:
    """Change its URL, events and status (``PATCH /v1/webhooks/{id}``)."""
    security.check_form(request, signed_in.csrf_token)
    body: dict[str, Any] = _form(request, "url", "status")
    body["events"] = request.form.getlist("events")
    try:
        dash.service.act(signed_in.record.key_id, UPDATE_WEBHOOK, {"webhook_id": webhook_id},
                         body=body)  # fmt: skip
    except ValidationFailed as exc:
        return webhook(dash, request, signed_in, webhook_id, problem=exc.message, status=400)
    return redirect(f"/dashboard/webhooks/{webhook_id}", 303)


def test_webhook(
    dash: Dashboard, request: Request, signed_in: SignedIn, webhook_id: str
) -> Response:
    security.check_form(request, signed_in.csrf_token)
    dash.service.act(signed_in.record.key_id, TEST_WEBHOOK, {"webhook_id": webhook_id})
    return redirect(f"/dashboard/webhooks/{webhook_id}", 303)


def delete_webhook(dash: Dashboard, request: Request, signed_in: SignedIn,
                   webhook_id: str) -> Response:  # fmt: skip
    security.check_form(request, signed_in.csrf_token)
    dash.service.act(signed_in.record.key_id, DELETE_WEBHOOK, {"webhook_id": webhook_id})
    return redirect("/dashboard/webhooks", 303)


def templates(dash: Dashboard, request: Request, signed_in: SignedIn, problem: str | None = None,
              status: int = 200) -> Response:  # fmt: skip
    listed = dash.service.act(signed_in.record.key_id, LIST_TEMPLATES, query={"limit": "100"})
    return dash.render("templates.html", status=status, signed_in=signed_in,
                       templates=listed["data"], problem=problem)  # fmt: skip


def create_template(dash: Dashboard, request: Request, signed_in: SignedIn) -> Response:
    def change() -> Response:
        body = _form(request, *_TEMPLATE_PARTS)
        dash.service.act(signed_in.record.key_id, CREATE_TEMPLATE, body=body)
        return redirect("/dashboard/templates", 303)

    return _refused_or(dash, request, signed_in, templates, change)


def template(dash: Dashboard, request: Request, signed_in: SignedIn, template_id: str,
             problem: str | None = None, status: int = 200) -> Response:  # fmt: skip
    shown = dash.service.act(signed_in.record.key_id, GET_TEMPLATE, {"template_id": template_id})
    if request.method == "POST":  # shown again with what was sent, and why it was refused
        shown = {**shown, **{part: request.form.get(part, "") for part in _TEMPLATE_PARTS}}
    return dash.render("template.html", status=status, signed_in=signed_in, template=shown,
                       problem=problem)  # fmt: skip


_TEMPLATE_PARTS = ("name", "subject", "html", "text")


def update_template(
    dash: Dashboard, request: Request, signed_in: SignedIn, template_id: str
) -> Response:
    security.check_form(request, signed_in.csrf_token)
    body = _form(request, *_TEMPLATE_PARTS)
    try:
        dash.service.act(signed_in.record.key_id, UPDATE_TEMPLATE, {"template_id": template_id},
                         body=body)  # fmt: skip
    except ValidationFailed as exc:
        return template(dash, request, signed_in, template_id, problem=exc.message, status=400)
    return redirect(f"/dashboard/templates/{template_id}", 303)


def delete_template(dash: Dashboard, request: Request, signed_in: SignedIn,
                    template_id: str) -> Response:  # fmt: skip
    security.check_form(request, signed_in.csrf_token)
    dash.service.act(signed_in.record.key_id, DELETE_TEMPLATE, {"template_id": template_id})
    return redirect("/dashboard/templates", 303)
