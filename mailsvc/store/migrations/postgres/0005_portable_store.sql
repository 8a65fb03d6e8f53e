-- The store behind one contract for both backends (SQLite's 0005 gives it the sequence columns
-- and constraint names this schema had from the start):
-- * a rate-limit bucket that records whether the last request took a token, so that refilling,
--   taking and answering are one statement;
-- * idempotency rows that always hold their answer (claimed, handled and answered in one
--   transaction), and no API key secret kept in a stored answer;
-- * the service's own secrets (the key that seals paging cursors).
ALTER TABLE rate_buckets ADD COLUMN taken bigint NOT NULL DEFAULT 0;

DELETE FROM idempotency_keys WHERE in_flight_until IS NOT NULL OR response_status IS NULL;
UPDATE idempotency_keys
    SET response_body = jsonb_set(response_body::jsonb, '{key}', 'null'::jsonb)::text
    WHERE jsonb_typeof(response_body::jsonb -> 'key') = 'string';  -- every stored answer is JSON
ALTER TABLE idempotency_keys DROP COLUMN in_flight_until;
ALTER TABLE idempotency_keys ALTER COLUMN response_status SET NOT NULL;
ALTER TABLE idempotency_keys ALTER COLUMN response_body SET NOT NULL;

CREATE TABLE service_secrets (
    name   text PRIMARY KEY,
    value  bytea NOT NULL
);
