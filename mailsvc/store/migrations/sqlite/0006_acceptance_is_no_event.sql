-- An email's timeline begins with its acceptance, which is the email's own created_at:
-- presented from it, not kept as an event row of its own.
DELETE FROM events WHERE type = 'queued';
