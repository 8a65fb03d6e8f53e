-- An account's template CPU bucket may go below empty: a render that overran what was left is
-- charged in full, and the account waits until the bucket is above empty again. Every other
-- bucket is still refused below empty by the CHECK (a request token cannot be owed).
CREATE TABLE rate_buckets_owing (
    account_id   TEXT NOT NULL,
    route_group  TEXT NOT NULL,
    tokens       REAL NOT NULL CONSTRAINT rate_buckets_tokens_check
                 CHECK (tokens >= 0 OR route_group = 'template_cpu_ms'),
    updated_at   REAL NOT NULL,
    PRIMARY KEY (account_id, route_group)
) WITHOUT ROWID;
INSERT INTO rate_buckets_owing (account_id, route_group, tokens, updated_at)
    SELECT account_id, route_group, tokens, updated_at FROM rate_buckets;
DROP TABLE rate_buckets;
ALTER TABLE rate_buckets_owing RENAME TO rate_buckets;
