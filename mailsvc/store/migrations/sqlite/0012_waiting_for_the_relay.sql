-- Emails whose last attempt could not reach the relay (refused, timed out, TLS or login
-- refused) say since when they wait for it: when a process reaches the relay again, it makes
-- them due at once instead of at their next retry. The index holds only those emails.
ALTER TABLE emails ADD COLUMN waits_for_relay_since REAL;
CREATE INDEX emails_waiting_for_relay ON emails (seq) WHERE waits_for_relay_since IS NOT NULL;
