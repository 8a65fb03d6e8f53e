"""The names of every status an email or a recipient can have."""

QUEUED = "queued"
SENDING = "sending"
SENT = "sent"
FAILED = "failed"

#: Statuses after which delivery never looks at an email again.
FINAL = frozenset({SENT, FAILED})
