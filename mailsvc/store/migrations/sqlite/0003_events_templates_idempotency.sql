-- The timeline of each email, account templates, stored answers to idempotent requests,
-- and an index for listing emails by recipient.
CREATE TABLE events (
    email_seq  INTEGER NOT NULL REFERENCES emails (seq),
    at         REAL NOT NULL,
    type       TEXT NOT NULL,
    detail     TEXT
);
CREATE INDEX events_by_email ON events (email_seq);

CREATE INDEX recipients_by_address ON recipients (address);

CREATE TABLE templates (
    seq         INTEGER PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    account_id  TEXT NOT NULL REFERENCES accounts (id),
    name        TEXT NOT NULL,
    subject     TEXT,
    html        TEXT,
    text        TEXT,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE INDEX templates_by_account ON templates (account_id, seq);

CREATE TABLE idempotency_keys (
    account_id        TEXT NOT NULL,
    key               TEXT NOT NULL,
    fingerprint       TEXT NOT NULL,
    created_at        REAL NOT NULL,
    -- While the first request runs: when its claim may be taken over (it died). NULL once done.
    in_flight_until   REAL,
    response_status   INTEGER,
    response_body     TEXT,
    PRIMARY KEY (account_id, key)
) WITHOUT ROWID;
CREATE INDEX idempotency_by_age ON idempotency_keys (created_at);
