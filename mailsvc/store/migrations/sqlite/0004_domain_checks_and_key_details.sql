-- Domains verified through DNS: an ownership token and the result of the last check.
-- API keys managed over HTTP: a name, an optional sender domain, when last used.
ALTER TABLE domains ADD COLUMN verification_token TEXT;
ALTER TABLE domains ADD COLUMN checked_at REAL;
ALTER TABLE domains ADD COLUMN check_results TEXT;
UPDATE domains SET verification_token = lower(hex(randomblob(16)))
    WHERE verification_token IS NULL;

ALTER TABLE api_keys ADD COLUMN name TEXT;
ALTER TABLE api_keys ADD COLUMN domain TEXT;
ALTER TABLE api_keys ADD COLUMN last_used_at REAL;
CREATE INDEX api_keys_by_account ON api_keys (account_id);
