-- Domains verified through DNS: an ownership token and the result of the last check.
-- API keys managed over HTTP: a name, an optional sender domain, when last used.
ALTER TABLE domains ADD COLUMN verification_token text;
ALTER TABLE domains ADD COLUMN checked_at double precision;
ALTER TABLE domains ADD COLUMN check_results jsonb;
UPDATE domains SET verification_token = md5(random()::text || clock_timestamp()::text)
    WHERE verification_token IS NULL;

ALTER TABLE api_keys ADD COLUMN name text;
ALTER TABLE api_keys ADD COLUMN domain text;
ALTER TABLE api_keys ADD COLUMN last_used_at double precision;
CREATE INDEX api_keys_by_account ON api_keys (account_id, seq);
CREATE INDEX domains_by_account ON domains (account_id, seq);
