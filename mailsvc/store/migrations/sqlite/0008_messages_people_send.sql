-- What a message may carry besides to, subject and a body: cc and bcc recipients and display
-- names, several reply-to addresses, headers of the client's own, attachments, tags, a time
-- to send it at; and what it was charged, to give back if it is canceled.
ALTER TABLE recipients ADD COLUMN kind TEXT NOT NULL DEFAULT 'to';
ALTER TABLE recipients ADD COLUMN name TEXT;

-- reply_to becomes a JSON array of addresses (each address or Name <address>).
UPDATE emails SET reply_to = json_array(reply_to) WHERE reply_to IS NOT NULL;
ALTER TABLE emails ADD COLUMN headers TEXT;
ALTER TABLE emails ADD COLUMN charged INTEGER NOT NULL DEFAULT 0;
ALTER TABLE emails ADD COLUMN scheduled_at REAL;

CREATE TABLE attachments (
    email_seq     INTEGER NOT NULL REFERENCES emails (seq),
    position      INTEGER NOT NULL,
    filename      TEXT NOT NULL,
    content_type  TEXT NOT NULL,
    content_id    TEXT,
    content       BLOB NOT NULL,
    PRIMARY KEY (email_seq, position)
) WITHOUT ROWID;

CREATE TABLE email_tags (
    email_seq  INTEGER NOT NULL REFERENCES emails (seq),
    position   INTEGER NOT NULL,
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    PRIMARY KEY (email_seq, position)
) WITHOUT ROWID;
CREATE INDEX email_tags_by_tag ON email_tags (name, value, email_seq);
