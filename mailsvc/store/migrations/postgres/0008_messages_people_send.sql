-- What a message may carry besides to, subject and a body: cc and bcc recipients and display
-- names, several reply-to addresses, headers of the client's own, attachments, tags, a time
-- to send it at; and what it was charged, to give back if it is canceled.
ALTER TABLE recipients ADD COLUMN kind text NOT NULL DEFAULT 'to';
ALTER TABLE recipients ADD COLUMN name text;

-- reply_to becomes a JSON array of addresses (each address or Name <address>).
ALTER TABLE emails ALTER COLUMN reply_to TYPE jsonb
    USING CASE WHEN reply_to IS NULL THEN NULL ELSE jsonb_build_array(reply_to) END;
ALTER TABLE emails ADD COLUMN headers jsonb;
ALTER TABLE emails ADD COLUMN charged bigint NOT NULL DEFAULT 0;
ALTER TABLE emails ADD COLUMN scheduled_at double precision;

CREATE TABLE attachments (
    email_seq     bigint NOT NULL REFERENCES emails (seq),
    position      bigint NOT NULL,
    filename      text NOT NULL,
    content_type  text NOT NULL,
    content_id    text,
    content       bytea NOT NULL,
    PRIMARY KEY (email_seq, position)
);

CREATE TABLE email_tags (
    email_seq  bigint NOT NULL REFERENCES emails (seq),
    position   bigint NOT NULL,
    name       text NOT NULL,
    value      text NOT NULL,
    PRIMARY KEY (email_seq, position)
);
CREATE INDEX email_tags_by_tag ON email_tags (name, value, email_seq);
