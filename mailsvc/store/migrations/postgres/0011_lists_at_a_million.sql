-- Lists that stay fast with a million emails: recipients and tags carry their email's account,
-- and are indexed by account, then address (or tag), then email, so that GET /v1/emails?to= and
-- ?tag= walk one account's matches newest first and stop at the page's end, whatever other
-- accounts hold.
ALTER TABLE recipients ADD COLUMN account_id text;
UPDATE recipients SET account_id = emails.account_id FROM emails WHERE emails.seq = recipients.email_seq;
ALTER TABLE recipients ALTER COLUMN account_id SET NOT NULL;
DROP INDEX recipients_by_address;
CREATE INDEX recipients_by_account_address ON recipients (account_id, address, email_seq);

ALTER TABLE email_tags ADD COLUMN account_id text;
UPDATE email_tags SET account_id = emails.account_id FROM emails WHERE emails.seq = email_tags.email_seq;
ALTER TABLE email_tags ALTER COLUMN account_id SET NOT NULL;
DROP INDEX email_tags_by_tag;
CREATE INDEX email_tags_by_account_tag ON email_tags (account_id, name, value, email_seq);
