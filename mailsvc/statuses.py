"""The names of every status an email or a recipient can have.

An email: ``queued`` -> ``sending`` -> ``sent``; a temporary failure for any recipient makes it
``deferred`` until its next attempt; once no recipient is pending it ends ``sent`` (all
delivered), ``failed`` (none delivered) or ``partially_sent`` (some delivered, some failed).
A scheduled email is ``scheduled`` until its time, when a delivery thread claims it as any
other (``sending``); canceled before then, it is ``canceled``.
A recipient: ``queued`` -> ``sent`` | ``deferred`` -> ... -> ``sent`` | ``failed``, or
``canceled`` with its email.
"""

SCHEDULED = "scheduled"
QUEUED = "queued"
SENDING = "sending"
DEFERRED = "deferred"
SENT = "sent"
PARTIALLY_SENT = "partially_sent"
FAILED = "failed"
CANCELED = "canceled"

#: Statuses after which delivery never looks at an email (or a recipient) again.
FINAL = frozenset({SENT, PARTIALLY_SENT, FAILED, CANCELED})
