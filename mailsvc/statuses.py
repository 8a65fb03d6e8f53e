"""The names of every status an email or a recipient can have.

An email: ``queued`` -> ``sending`` -> ``sent``; a temporary failure for any recipient makes it
``deferred`` until its next attempt; once no recipient is pending it ends ``sent`` (all
delivered), ``failed`` (none delivered) or ``partially_sent`` (some delivered, some failed).
A scheduled email is ``scheduled`` until its time, when a delivery thread claims it as any
other (``sending``); canceled before then, it is ``canceled``. After the handoff, bounce reports
may follow: a sent email none of whose recipients is still delivered (each bounced) becomes
``bounced``.
A recipient: ``queued`` -> ``sent`` | ``deferred`` -> ... -> ``sent`` | ``failed``, or
``canceled`` with its email, or ``suppressed`` (its address is on the account's suppression
list: never sent to, never charged). A ``sent`` recipient becomes ``bounced`` when a report says
the mailbox refused the message after all, or ``complained`` when its owner marked it as spam.
"""

SCHEDULED = "scheduled"
QUEUED = "queued"
SENDING = "sending"
DEFERRED = "deferred"
SENT = "sent"
PARTIALLY_SENT = "partially_sent"
FAILED = "failed"
CANCELED = "canceled"
BOUNCED = "bounced"
COMPLAINED = "complained"
SUPPRESSED = "suppressed"

#: Statuses after which delivery never looks at an email (or a recipient) again.
FINAL = frozenset({SENT, PARTIALLY_SENT, FAILED, CANCELED, BOUNCED, COMPLAINED, SUPPRESSED})

#: Every status an email can have, in the order of its life.
EMAIL_STATUSES = (
    SCHEDULED,
    QUEUED,
    SENDING,
    DEFERRED,
    SENT,
    PARTIALLY_SENT,
    FAILED,
    CANCELED,
    BOUNCED,
)
#: Every status a recipient can have.
RECIPIENT_STATUSES = (QUEUED, DEFERRED, SENT, FAILED, CANCELED, SUPPRESSED, BOUNCED, COMPLAINED)
