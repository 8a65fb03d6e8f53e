-- Dashboard sessions: a browser signed in with an API key. The cookie holds a random session
-- id; the store keeps only its SHA-256, the key it was opened with, and its times.
CREATE TABLE dashboard_sessions (
    id_hash     bytea PRIMARY KEY,
    account_id  text NOT NULL,
    key_id      text NOT NULL,
    created_at  double precision NOT NULL,
    seen_at     double precision NOT NULL
);
CREATE INDEX dashboard_sessions_by_key ON dashboard_sessions (key_id);
CREATE INDEX dashboard_sessions_by_account ON dashboard_sessions (account_id, seen_at);
-- The dashboard's chart of an account's last days: by account and time, with the status, so that
-- counting them reads this index alone.
CREATE INDEX emails_by_account_and_age ON emails (account_id, created_at, status);
