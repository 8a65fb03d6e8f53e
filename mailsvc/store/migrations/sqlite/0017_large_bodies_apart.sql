-- The html and text of a large email, in a row of their own: SQLite rewrites a row whole, with
-- its overflow pages, whenever a column of it changes, and an email's row changes as it is
-- claimed and as its outcome is recorded, each under the one write lock (a 10 MB body held it
-- 136 ms at its claim). Written once with the email, never changed; the email's own html and
-- text are NULL then (see QueueVerbs and history.EMAIL_COLUMNS).
CREATE TABLE email_bodies (
    email_seq  INTEGER PRIMARY KEY REFERENCES emails (seq),
    html       TEXT,
    text       TEXT
);
