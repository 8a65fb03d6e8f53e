-- The html and text of a large email, in a row of their own, as on SQLite (whose rows are
-- rewritten whole at each change; here they would stay out of line, TOASTed, all the same):
-- one schema and one set of statements for both backends.
CREATE TABLE email_bodies (
    email_seq  bigint PRIMARY KEY REFERENCES emails (seq),
    html       text,
    text       text
);
