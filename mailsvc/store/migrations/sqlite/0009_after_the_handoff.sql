-- After the handoff: bounce and complaint reports matched to the email they belong to (by its
-- Message-ID when the envelope sender carries no token), the reports already used, each
-- account's suppression list, and webhooks: endpoints, the event types each wants, the
-- deliveries waiting or done (an outbox written with the change that causes each event), and
-- every attempt of each.
CREATE INDEX emails_by_message_id ON emails (message_id);

CREATE TABLE suppressions (
    seq         INTEGER PRIMARY KEY,
    account_id  TEXT NOT NULL REFERENCES accounts (id),
    address     TEXT NOT NULL,
    reason      TEXT NOT NULL CHECK (reason IN ('bounced', 'complained', 'manual')),
    email_id    TEXT,
    detail      TEXT,
    created_at  REAL NOT NULL,
    CONSTRAINT suppressions_account_address UNIQUE (account_id, address)
);
CREATE INDEX suppressions_by_account ON suppressions (account_id, seq);

CREATE TABLE inbound_reports (
    report_key    TEXT PRIMARY KEY,
    processed_at  REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE webhooks (
    seq              INTEGER PRIMARY KEY,
    id               TEXT NOT NULL UNIQUE,
    account_id       TEXT NOT NULL REFERENCES accounts (id),
    url              TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('enabled', 'disabled')),
    disabled_reason  TEXT,
    -- Signing secrets, sealed (AES-GCM) under a key of the service's; the previous one signs
    -- too until previous_until, so a receiver can switch to a rotated secret without a gap.
    secret           BLOB NOT NULL,
    previous_secret  BLOB,
    previous_until   REAL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    -- Since when every delivery to it has failed, how many in a row, and when to try it again
    -- (a failing endpoint is tried once per back-off, not once per waiting delivery).
    failing_since    REAL,
    failures         INTEGER NOT NULL DEFAULT 0,
    retry_at         REAL
);
CREATE INDEX webhooks_by_account ON webhooks (account_id, seq);

CREATE TABLE webhook_subscriptions (
    account_id  TEXT NOT NULL,
    event_type  TEXT NOT NULL,
    webhook_id  TEXT NOT NULL REFERENCES webhooks (id),
    PRIMARY KEY (account_id, event_type, webhook_id)
) WITHOUT ROWID;

CREATE TABLE webhook_deliveries (
    seq          INTEGER PRIMARY KEY,
    -- The webhook-id header: the same for every attempt of the event.
    event_id     TEXT NOT NULL,
    webhook_id   TEXT NOT NULL REFERENCES webhooks (id),
    account_id   TEXT NOT NULL,
    -- The events of one email go to one endpoint in the order they were created.
    email_seq    INTEGER,
    type         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    created_at   REAL NOT NULL,
    status       TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    -- Its next attempt, or the end of the lease of the thread delivering it; NULL once final.
    due_at       REAL,
    lease_owner  TEXT,
    CONSTRAINT webhook_deliveries_event UNIQUE (webhook_id, event_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook_id, seq);
CREATE INDEX webhook_deliveries_waiting ON webhook_deliveries (webhook_id, email_seq, seq)
    WHERE due_at IS NOT NULL;
CREATE INDEX webhook_deliveries_by_email ON webhook_deliveries (email_seq);

CREATE TABLE webhook_attempts (
    delivery_seq  INTEGER NOT NULL REFERENCES webhook_deliveries (seq),
    number        INTEGER NOT NULL,
    at            REAL NOT NULL,
    http_status   INTEGER,
    duration_ms   REAL NOT NULL,
    error         TEXT,
    PRIMARY KEY (delivery_seq, number)
) WITHOUT ROWID;
