"""The version of mailsvc that runs: the installed package's, read when first asked for
(``importlib.metadata`` is heavy to load in every worker for a string it rarely uses)."""

from __future__ import annotations

from functools import cache


@cache
def installed() -> str:
    """The installed package's version; ``0.0.0+checkout`` when run from a checkout that was
    never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mailsvc")
    except PackageNotFoundError:
        return "0.0.0+checkout"
