"""Where the server's lines go, and how they read: ``MAILSVC_LOG_FORMAT`` ``text`` or ``json``,
on standard error, at INFO.

The lines: one per request (``mailsvc.access``), one per delivery attempt
(``mailsvc.delivery``), one when the relay cannot be reached and one when it can again, and
warnings and errors with their tracebacks. In ``json``, each line is an object with ``time``,
``level``, ``logger``, ``message`` and the line's own fields (``method``, ``status``,
``request_id``, ``email``, ...). An app embedded in another leaves logging to its host: only
``gunicorn.conf.py`` (and the CLI) call :func:`configure`.

A line cannot be forged: in ``text``, every control character of a message (CR, LF, NUL, the
Unicode line and paragraph separators, ...) is written as an escape (``\x0a``), so what a
client sent (a path, a header) stays inside its own line; ``json`` escapes them itself.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

#: Attributes every log record has; the rest are a line's own fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _time(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: What would end a line, or hide or fake part of one, in a terminal or a log reader.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escaped(text: str) -> str:
    """``text`` with each control character written as an escape: one line, as it was."""
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if _CONTROL.search(message):
            message = escaped(message)
        line = f"{_time(record)} {record.levelname} {record.name}: {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update((name, value) for name, value in vars(record).items() if name not in _STANDARD)
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(log_format: str) -> None:
    """Send the ``mailsvc`` loggers' lines to standard error, in this format; and the warnings
    of every library that logs (psycopg and its pool, aiosmtpd...) the same way, through the
    root logger, so that no line on standard error is left in another format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logger = logging.getLogger("mailsvc")
    # No line says where in the code it was logged from, so the caller's frame is not looked
    # up for each (the logging documentation's "Optimization": a request's line costs less).
    logging._srcfile = None  # type: ignore[attr-defined]
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)


def gunicorn_logging(log_format: str) -> dict[str, Any]:
    """gunicorn's ``logconfig_dict``: its own lines (a worker booted, a signal handled) in the
    service's format on standard error, as every other line, and the root logger's (the
    libraries' warnings) too; the service's loggers are left as :func:`configure` made them."""
    formatter = JsonFormatter if log_format == "json" else TextFormatter
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "mailsvc",
        "stream": "ext://sys.stderr",
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"mailsvc": {"()": formatter}},
        "handlers": {"stderr": handler},
        "root": {"level": "WARNING", "handlers": ["stderr"]},
        "loggers": {
            "gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
            "gunicorn.access": {"level": "INFO", "handlers": [], "propagate": False},
        },
    }
