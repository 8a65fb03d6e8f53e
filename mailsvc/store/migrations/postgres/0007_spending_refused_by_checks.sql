-- Spending credit and rate-limit tokens, each one statement that a CHECK constraint refuses
-- (so that PostgreSQL can send it with the COMMIT, and lock the row only while it commits).
ALTER TABLE rate_buckets DROP COLUMN taken;
ALTER TABLE rate_buckets ADD CONSTRAINT rate_buckets_tokens_check CHECK (tokens >= 0);
