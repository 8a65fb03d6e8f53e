"""Timestamps as the API shows and reads them: ISO 8601, UTC."""

from __future__ import annotations

from datetime import UTC, datetime

from .errors import ValidationFailed


def iso_time(timestamp: float | None) -> str | None:
    """ISO 8601 in UTC with milliseconds (``2026-11-21T09:02:10.123Z``)."""
    if timestamp is None:
        return None
    moment = datetime.fromtimestamp(timestamp, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso_time(value: str, field: str) -> float:
    """Seconds since the epoch of an ISO 8601 date or date-time; UTC when no offset is given.

    :raises ValidationFailed: naming ``field``.
    """
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValidationFailed(
            f"{field}: must be an ISO 8601 date-time, such as 2026-11-21T09:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_instant(value: str, field: str) -> float:
    """Seconds since the epoch of an ISO 8601 date-time that says its offset (or ``Z``): a
    moment that means the same wherever the client is.

    :raises ValidationFailed: naming ``field``.
    """
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None or "T" not in value.upper():
        raise ValidationFailed(
            f"{field}: must be an ISO 8601 date-time with an offset or Z, such as "
            f"2026-11-21T09:00:00Z"
        )
    return moment.timestamp()
