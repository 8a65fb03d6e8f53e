-- An account's template CPU bucket may go below empty: a render that overran what was left is
-- charged in full, and the account waits until the bucket is above empty again. Every other
-- bucket is still refused below empty by the CHECK (a request token cannot be owed).
ALTER TABLE rate_buckets DROP CONSTRAINT rate_buckets_tokens_check;
ALTER TABLE rate_buckets ADD CONSTRAINT rate_buckets_tokens_check
    CHECK (tokens >= 0 OR route_group = 'template_cpu_ms');
