"""TLS of SMTP submission: the context its certificate makes, and what ``mailsvc check`` says
of its settings."""

from __future__ import annotations

import os
import ssl
from typing import Any

from ..settings import Settings, SettingsError

_LOOPBACK = ("127.0.0.1", "::1", "[::1]", "localhost")


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The server's TLS context (TLS 1.2 at least), or None when no certificate is set.

    :raises SettingsError: the certificate or its key cannot be loaded, or they do not match.
    """
    cert, key = settings.submission_tls_cert, settings.submission_tls_key
    if not cert and not key:
        if settings.submission_implicit_tls:
            raise SettingsError(
                "MAILSVC_SUBMISSION_IMPLICIT_TLS=true needs MAILSVC_SUBMISSION_TLS_CERT and "
                "MAILSVC_SUBMISSION_TLS_KEY"
            )
        return None
    if not cert or not key:
        raise SettingsError(
            "MAILSVC_SUBMISSION_TLS_CERT and MAILSVC_SUBMISSION_TLS_KEY are set together"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise SettingsError(f"MAILSVC_SUBMISSION_TLS_*: {exc.filename}: no such file") from None
    except ssl.SSLError as exc:
        reason = "the key does not match the certificate" if "MISMATCH" in str(exc) else exc
        raise SettingsError(
            f"MAILSVC_SUBMISSION_TLS_*: cannot load {cert} with {key} ({reason})"
        ) from None
    except OSError as exc:
        raise SettingsError(f"MAILSVC_SUBMISSION_TLS_*: {exc.strerror or exc}") from None
    return context


def check_submission(settings: Settings) -> dict[str, Any]:
    """What ``mailsvc check`` says of SMTP submission's settings: whether its TLS loads, and
    warnings for what works but should not be so."""
    found: dict[str, Any] = {"ok": True, "listen": settings.submission_listen}
    warnings = []
    try:
        context = tls_context(settings)
    except SettingsError as exc:
        return {**found, "ok": False, "error": str(exc)}
    if context is None:
        found["tls"] = "none"
        if not settings.submission_allow_plaintext:
            warnings.append(
                "no MAILSVC_SUBMISSION_TLS_CERT and no MAILSVC_SUBMISSION_ALLOW_PLAINTEXT: "
                "AUTH is never offered, so no message can be submitted"
            )
    else:
        found["tls"] = "implicit" if settings.submission_implicit_tls else "starttls"
    host = settings.submission_listen.rpartition(":")[0]
    if settings.submission_allow_plaintext and host not in _LOOPBACK:
        warnings.append(
            f"MAILSVC_SUBMISSION_ALLOW_PLAINTEXT=true on {settings.submission_listen}: API keys "
            "may cross the network in clear before STARTTLS"
        )
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        warnings.append(
            "no PROMETHEUS_MULTIPROC_DIR: the submission process's metrics are not in "
            "gunicorn's /metrics (give both the same folder; see docs/operating.md)"
        )
    found["warnings"] = warnings
    return found
