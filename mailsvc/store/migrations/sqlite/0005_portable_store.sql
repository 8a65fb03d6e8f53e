-- The store behind a contract that a second backend (PostgreSQL) implements too:
-- * named sequence columns where rows were ordered by SQLite's implicit rowid;
-- * named unique constraints, which both backends report by name;
-- * a rate-limit bucket that records whether the last request took a token, so that refilling,
--   taking and answering are one statement;
-- * idempotency rows that always hold their answer (claimed, handled and answered in one
--   transaction), and no API key secret kept in a stored answer;
-- * the service's own secrets (the key that seals paging cursors).
CREATE TABLE api_keys_portable (
    seq           INTEGER PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    account_id    TEXT NOT NULL REFERENCES accounts (id),
    secret_hash   BLOB NOT NULL,
    scope         TEXT NOT NULL CHECK (scope IN ('full', 'sending')),
    created_at    REAL NOT NULL,
    revoked_at    REAL,
    name          TEXT,
    domain        TEXT,
    last_used_at  REAL
);
INSERT INTO api_keys_portable (seq, id, account_id, secret_hash, scope, created_at, revoked_at,
                               name, domain, last_used_at)
    SELECT rowid, id, account_id, secret_hash, scope, created_at, revoked_at, name, domain,
           last_used_at
    FROM api_keys;
DROP TABLE api_keys;
ALTER TABLE api_keys_portable RENAME TO api_keys;
CREATE INDEX api_keys_by_account ON api_keys (account_id, seq);

CREATE TABLE domains_portable (
    seq                 INTEGER PRIMARY KEY,
    id                  TEXT NOT NULL UNIQUE,
    account_id          TEXT NOT NULL REFERENCES accounts (id),
    name                TEXT NOT NULL,
    verified_at         REAL,
    created_at          REAL NOT NULL,
    dkim_selector       TEXT,
    dkim_private_key    TEXT,
    verification_token  TEXT,
    checked_at          REAL,
    check_results       TEXT,
    CONSTRAINT domains_account_name UNIQUE (account_id, name)
);
INSERT INTO domains_portable (seq, id, account_id, name, verified_at, created_at, dkim_selector,
                              dkim_private_key, verification_token, checked_at, check_results)
    SELECT rowid, id, account_id, name, verified_at, created_at, dkim_selector,
           dkim_private_key, verification_token, checked_at, check_results
    FROM domains;
DROP TABLE domains;
ALTER TABLE domains_portable RENAME TO domains;
CREATE UNIQUE INDEX domains_verified_once ON domains (name) WHERE verified_at IS NOT NULL;
CREATE INDEX domains_by_account ON domains (account_id, seq);

CREATE TABLE events_portable (
    seq        INTEGER PRIMARY KEY,
    email_seq  INTEGER NOT NULL REFERENCES emails (seq),
    at         REAL NOT NULL,
    type       TEXT NOT NULL,
    detail     TEXT
);
INSERT INTO events_portable (seq, email_seq, at, type, detail)
    SELECT rowid, email_seq, at, type, detail FROM events;
DROP TABLE events;
ALTER TABLE events_portable RENAME TO events;
CREATE INDEX events_by_email ON events (email_seq, seq);

ALTER TABLE rate_buckets ADD COLUMN taken INTEGER NOT NULL DEFAULT 0;

CREATE TABLE idempotency_portable (
    account_id       TEXT NOT NULL,
    key              TEXT NOT NULL,
    fingerprint      TEXT NOT NULL,
    created_at       REAL NOT NULL,
    response_status  INTEGER NOT NULL,
    response_body    TEXT NOT NULL,
    PRIMARY KEY (account_id, key)
) WITHOUT ROWID;
INSERT INTO idempotency_portable
    SELECT account_id, key, fingerprint, created_at, response_status,
           -- An API key's secret exists in clear only in the answer that created it.
           CASE WHEN json_valid(response_body) AND json_type(response_body, '$.key') = 'text'
                THEN json_set(response_body, '$.key', json('null'))
                ELSE response_body END
    FROM idempotency_keys
    WHERE in_flight_until IS NULL AND response_status IS NOT NULL;
DROP TABLE idempotency_keys;
ALTER TABLE idempotency_portable RENAME TO idempotency_keys;
CREATE INDEX idempotency_by_age ON idempotency_keys (created_at);

CREATE TABLE service_secrets (
    name   TEXT PRIMARY KEY,
    value  BLOB NOT NULL
) WITHOUT ROWID;
