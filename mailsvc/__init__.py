"""mailsvc: a self-hosted transactional email sending service.

Importing this package opens no database and starts no thread: :func:`create_app` returns a
plain WSGI callable that can be mounted anywhere; its ``start()`` begins delivery.
"""

from typing import Any

from .app import MailService, create_app

__all__ = ["MailService", "__version__", "create_app"]


def __getattr__(name: str) -> Any:
    """``__version__``, read from the installed package's metadata when asked for."""
    if name != "__version__":
        raise AttributeError(name)
    from .ops.version import installed

    return installed()
