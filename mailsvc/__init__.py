"""mailsvc: a self-hosted transactional email sending service.

Importing this package opens no database and starts no thread: :func:`create_app` returns a
plain WSGI callable that can be mounted anywhere; its ``start()`` begins delivery.
"""

from typing import Any

from .app import MailService, create_app

__all__ = ["MailService", "__version__", "create_app"]


def __getattr__(name: str) -> Any:
    """``__version__``, read from the installed package's metadata when asked for
    (``importlib.metadata`` is heavy to load in every worker for a string it never uses)."""
    if name != "__version__":
        raise AttributeError(name)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mailsvc")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0.0.0+checkout"
