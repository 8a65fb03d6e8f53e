"""mailsvc: a self-hosted transactional email sending service.

Importing this package opens no database and starts no thread: :func:`create_app` returns a
plain WSGI callable that can be mounted anywhere; its ``start()`` begins delivery.
"""

from .app import MailService, create_app

__all__ = ["MailService", "create_app"]
