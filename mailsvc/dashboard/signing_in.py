"""Signing in with an API key (the form, the attempt counted per client address, the session
opened) and signing out."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from werkzeug.utils import redirect
from werkzeug.wrappers import Request, Response

from ..errors import NotAuthenticated, RateLimited
from ..http.auth import authenticate, key_token
from ..store import TokenExhausted
from . import security, sessions
from .pages import Dashboard
from .sessions import SignedIn

#: The cookie that ties the sign-in form to the browser that loaded it (login CSRF).
SIGN_IN_COOKIE = "mailsvc_signin"


#: The rate-limit bucket of sign-in attempts, per client address.
SIGN_IN_GROUP = "dashboard_signin"


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
