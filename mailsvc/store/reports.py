"""Store verbs for what bounce and complaint reports change: which reports were used, the
recipients they name, and the email those recipients belong to."""

from __future__ import annotations

from collections.abc import Sequence

from .. import statuses
from .history import EMAIL_COLUMNS, HistoryVerbs
from .records import EmailRecord

#: What a recipient must be for a report to change it: only mail the relay took can bounce or
#: be complained about (a bounce of a complained-about recipient is news too).
REPORTABLE = {
    statuses.BOUNCED: (statuses.SENT, statuses.COMPLAINED),
    statuses.COMPLAINED: (statuses.SENT, statuses.BOUNCED),
}


class ReportVerbs(HistoryVerbs):
    def claim_report(self, report_key: str, now: float) -> bool:
        row = self.connection.execute(
            "INSERT INTO inbound_reports (report_key, processed_at) VALUES (?, ?) "
            "ON CONFLICT (report_key) DO NOTHING RETURNING 1",
            (report_key, now),
        ).fetchone()
        return row is not None

    def find_email(self, email_id: str) -> EmailRecord | None:
        row = self.connection.execute(
            f"SELECT {EMAIL_COLUMNS} FROM emails WHERE id = ?", (email_id,)
        ).fetchone()
        return self.with_recipients([row])[0] if row else None

    def find_emails_by_message_id(self, message_ids: Sequence[str]) -> list[EmailRecord]:
        if not message_ids:
            return []
        marks = ",".join("?" * len(message_ids))
        rows = self.connection.execute(
            f"SELECT {EMAIL_COLUMNS} FROM emails WHERE message_id IN ({marks})", list(message_ids)
        ).fetchall()
        return self.with_recipients(rows)

    def report_recipient(
        self,
        email_seq: int,
        position: int,
        status: str,
        enhanced_code: str | None,
        reply: str | None,
        at: float,
    ) -> bool:
        """Mark a recipient ``bounced`` or ``complained`` if it is one a report may change
        (checked and written in one update); then a sent email with no recipient left delivered
        is ``bounced``, one with some is ``partially_sent``."""
        allowed = REPORTABLE[status]
        changed = self.connection.execute(
            f"UPDATE recipients SET status = ?, enhanced_code = coalesce(?, enhanced_code), "
            f"reply = coalesce(?, reply) WHERE email_seq = ? AND position = ? "
            f"AND status IN ({','.join('?' * len(allowed))}) RETURNING account_id",
            (status, enhanced_code, reply, email_seq, position, *allowed),
        ).fetchone()
        if changed is None:
            return False
        self.count_outcome(changed[0], at, status, email_seq)
        if status == statuses.BOUNCED:
            self.run(
                "UPDATE emails SET status = CASE WHEN EXISTS (SELECT 1 FROM recipients "
                "WHERE email_seq = emails.seq AND status IN (?, ?)) THEN ? ELSE ? END "
                "WHERE seq = ? AND status IN (?, ?)",
                (
                    statuses.SENT,
                    statuses.COMPLAINED,
                    statuses.PARTIALLY_SENT,
                    statuses.BOUNCED,
                    email_seq,
                    statuses.SENT,
                    statuses.PARTIALLY_SENT,
                ),
            )
        return True
