-- The first schema: accounts, keys, domains, limits, rate buckets, and the email queue.
CREATE TABLE accounts (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    credits     INTEGER NOT NULL CHECK (credits >= 0),
    created_at  REAL NOT NULL
);

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    account_id   TEXT NOT NULL REFERENCES accounts (id),
    secret_hash  BLOB NOT NULL,
    scope        TEXT NOT NULL CHECK (scope IN ('full', 'sending')),
    created_at   REAL NOT NULL,
    revoked_at   REAL
);

CREATE TABLE domains (
    id           TEXT PRIMARY KEY,
    account_id   TEXT NOT NULL REFERENCES accounts (id),
    name         TEXT NOT NULL,
    verified_at  REAL,
    created_at   REAL NOT NULL,
    UNIQUE (account_id, name)
);
-- A domain is verified for one account at most.
CREATE UNIQUE INDEX domains_verified_once ON domains (name) WHERE verified_at IS NOT NULL;

CREATE TABLE account_limits (
    account_id   TEXT NOT NULL REFERENCES accounts (id),
    route_group  TEXT NOT NULL,
    per_minute   INTEGER NOT NULL CHECK (per_minute > 0),
    PRIMARY KEY (account_id, route_group)
) WITHOUT ROWID;

CREATE TABLE rate_buckets (
    account_id   TEXT NOT NULL,
    route_group  TEXT NOT NULL,
    tokens       REAL NOT NULL,
    updated_at   REAL NOT NULL,
    PRIMARY KEY (account_id, route_group)
) WITHOUT ROWID;

CREATE TABLE emails (
    seq             INTEGER PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    account_id      TEXT NOT NULL REFERENCES accounts (id),
    status          TEXT NOT NULL,
    sender_name     TEXT,
    sender_address  TEXT NOT NULL,
    reply_to        TEXT,
    subject         TEXT NOT NULL,
    html            TEXT,
    text            TEXT,
    template_id     TEXT,
    variables       TEXT,
    message_id      TEXT NOT NULL,
    created_at      REAL NOT NULL,
    sent_at         REAL,
    last_error      TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    -- When delivery must next look at the email: its next attempt, or the end of the lease of
    -- the thread sending it. NULL once the email is final.
    due_at          REAL,
    lease_owner     TEXT
);
CREATE INDEX emails_due ON emails (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX emails_by_account ON emails (account_id, seq);

CREATE TABLE recipients (
    email_seq      INTEGER NOT NULL REFERENCES emails (seq),
    position       INTEGER NOT NULL,
    address        TEXT NOT NULL,
    status         TEXT NOT NULL,
    smtp_code      INTEGER,
    enhanced_code  TEXT,
    reply          TEXT,
    PRIMARY KEY (email_seq, position)
) WITHOUT ROWID;
