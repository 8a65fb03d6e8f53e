"""mailsvc: a self-hosted transactional email sending service.

Importing this package opens no database and starts no thread: :func:`create_app` returns a
plain WSGI callable that can be mounted anywhere; its ``start()`` begins delivery.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mailsvc")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0.0.0+checkout"

from .app import MailService, create_app  # noqa: E402 (after the version, which it uses)

__all__ = ["MailService", "__version__", "create_app"]
