"""What every dashboard answer carries, and what every change asks of its request: the
Content-Security-Policy and the other headers, whether the browser came over HTTPS, its
address, and the CSRF and Origin checks of a form."""

from __future__ import annotations

import hmac
import ipaddress

from werkzeug.wrappers import Request, Response

from ..errors import Forbidden

#: Every page: nothing from another origin, no inline script, never framed.
PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; "
    "object-src 'none'"
)
#: An email's HTML, shown in a sandboxed frame of the page: its own styles, pictures given
#: inline, nothing else; no script, no form, no request to any origin.
PREVIEW_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'; sandbox"
)


def secure_headers(response: Response, policy: str = PAGE_POLICY) -> Response:
    response.headers["Content-Security-Policy"] = policy
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    if policy == PAGE_POLICY:
        response.headers["X-Frame-Options"] = "DENY"
    return response


def _behind_proxy(request: Request) -> bool:
    """The request came through a reverse proxy on this machine (the shipped nginx)."""
    try:
        return ipaddress.ip_address(request.remote_addr or "").is_loopback
    except ValueError:
        return False


def over_https(request: Request) -> bool:
    if request.scheme == "https":
        return True
    forwarded = request.headers.get("X-Forwarded-Proto", "")
    return _behind_proxy(request) and forwarded.strip().lower() == "https"


def client_address(request: Request) -> str:
    """The browser's address: the last hop nginx added, when it came through nginx."""
    if _behind_proxy(request):
        hops = [hop.strip() for hop in request.headers.get("X-Forwarded-For", "").split(",")]
        if hops and hops[-1]:
            return hops[-1][:64]
    return request.remote_addr or "unknown"


def check_form(request: Request, expected: str) -> None:
    """A change comes from our own page: its Origin is this site, and its form carries the
    session's CSRF token.

    :raises Forbidden: either is missing or wrong; nothing changes.
    """
    origin = request.headers.get("Origin")
    scheme = "https" if over_https(request) else "http"
    if origin != f"{scheme}://{request.host}":
        raise Forbidden("this form was not sent from this site's page (Origin)")
    given = request.form.get("csrf_token", "")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise Forbidden("this form's token is missing or out of date; reload the page")
