"""Store verbs for an account's templates."""

from __future__ import annotations

from .records import Template
from .sql import Connection, page_bound

_COLUMNS = "seq, id, account_id, name, subject, html, text, created_at, updated_at"


class TemplateVerbs:
    connection: Connection

    def create_template(
        self,
        template_id: str,
        account_id: str,
        name: str,
        subject: str | None,
        html: str | None,
        text: str | None,
        now: float,
    ) -> Template:
        row = self.connection.execute(
            f"INSERT INTO templates (id, account_id, name, subject, html, text, created_at, "
            f"updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING {_COLUMNS}",
            (template_id, account_id, name, subject, html, text, now, now),
        ).fetchone()
        assert row is not None
        return Template(*row)

    def get_template(self, account_id: str, template_id: str) -> Template | None:
        """The account's template with this id; None for an unknown id or another account's."""
        row = self.connection.execute(
            f"SELECT {_COLUMNS} FROM templates WHERE id = ? AND account_id = ?",
            (template_id, account_id),
        ).fetchone()
        return Template(*row) if row else None

    def update_template(
        self,
        account_id: str,
        template_id: str,
        name: str,
        subject: str | None,
        html: str | None,
        text: str | None,
        now: float,
    ) -> Template | None:
        row = self.connection.execute(
            f"UPDATE templates SET name = ?, subject = ?, html = ?, text = ?, updated_at = ? "
            f"WHERE id = ? AND account_id = ? RETURNING {_COLUMNS}",
            (name, subject, html, text, now, template_id, account_id),
        ).fetchone()
        return Template(*row) if row else None

    def delete_template(self, account_id: str, template_id: str) -> bool:
        cursor = self.connection.execute(
            "DELETE FROM templates WHERE id = ? AND account_id = ?", (template_id, account_id)
        )
        return cursor.rowcount == 1

    def list_templates(self, account_id: str, before_seq: int | None, limit: int) -> list[Template]:
        """The account's templates, newest first, older than ``before_seq``."""
        rows = self.connection.execute(
            f"SELECT {_COLUMNS} FROM templates WHERE account_id = ? AND seq < ? "
            f"ORDER BY seq DESC LIMIT ?",
            (account_id, page_bound(before_seq), limit),
        ).fetchall()
        return [Template(*row) for row in rows]
