-- Spending rate-limit tokens, one statement that a CHECK constraint refuses (as credit is
-- refused by accounts' CHECK (credits >= 0)).
CREATE TABLE rate_buckets_checked (
    account_id   TEXT NOT NULL,
    route_group  TEXT NOT NULL,
    tokens       REAL NOT NULL CONSTRAINT rate_buckets_tokens_check CHECK (tokens >= 0),
    updated_at   REAL NOT NULL,
    PRIMARY KEY (account_id, route_group)
) WITHOUT ROWID;
INSERT INTO rate_buckets_checked (account_id, route_group, tokens, updated_at)
    SELECT account_id, route_group, max(tokens, 0), updated_at FROM rate_buckets;
DROP TABLE rate_buckets;
ALTER TABLE rate_buckets_checked RENAME TO rate_buckets;
