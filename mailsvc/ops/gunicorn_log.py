"""gunicorn's logger for the service (``logger_class`` in gunicorn.conf.py): gunicorn's, without
its access line.

mailsvc writes its own (``mailsvc.access``: the account, the email, the request id). gunicorn's
is never written under the service's logging configuration, whose dictionary gives
``gunicorn.access`` no handler (and replaces the one ``--access-logfile`` would add), yet
gunicorn built it for every request all the same, once any logging configuration was given: a
dictionary of every header and a log record, 27 to 34 us of a worker's CPU a request on a slow
day, written nowhere.
"""

from __future__ import annotations

from typing import Any

from gunicorn import glogging


class Logger(glogging.Logger):
    #: (gunicorn's ASGI workers ask before they time a request for it)
    access_log_enabled = False

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        """No access line: see the module."""
