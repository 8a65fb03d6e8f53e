"""One access log line and the request metrics for each request, and the request's id.

A request id comes from the client's ``X-Request-Id`` when it is a sensible one (1 to 128
letters, digits and ``._:-``), else it is made; either way it is echoed in the answer and named
in the log line, so a client's report and the server's log meet. The line says the method, the
path, the status, the time taken, the account, the email (when there is one) and the request id.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from typing import Any

from werkzeug.wrappers import Request, Response

from ..ops import metrics

log = logging.getLogger("mailsvc.access")

HEADER = "X-Request-Id"
#: Set in the WSGI environ by the dispatcher, for the log line and the metrics.
ROUTE = "mailsvc.route"
ACCOUNT = "mailsvc.account"
EMAIL = "mailsvc.email"
_GIVEN = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(given: str | None) -> str:
    if given is not None and _GIVEN.fullmatch(given):
        return given
    return "req_" + secrets.token_hex(10)


def record(request: Request, response: Response, started: float, request_id: str) -> None:
    """Count the request and log its line (at INFO, on ``mailsvc.access``)."""
    environ: dict[str, Any] = request.environ
    seconds = time.perf_counter() - started
    route = environ.get(ROUTE, "unmatched")
    metrics.REQUESTS.labels(request.method, route, str(response.status_code)).inc()
    metrics.LATENCY.labels(request.method, route).observe(seconds)
    if log.isEnabledFor(logging.INFO):
        log.info(
            "%s %s %d %.1fms account=%s email=%s request=%s",
            request.method,
            request.path,
            response.status_code,
            seconds * 1000,
            environ.get(ACCOUNT, "-"),
            environ.get(EMAIL, "-"),
            request_id,
            extra={
                "method": request.method,
                "path": request.path,
                "status": response.status_code,
                "duration_ms": round(seconds * 1000, 2),
                "account": environ.get(ACCOUNT),
                "email": environ.get(EMAIL),
                "request_id": request_id,
            },
        )
