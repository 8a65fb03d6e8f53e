-- The html and text of a large email in a row of their own, as SQLite keeps them (its rows are
-- rewritten whole at each change). PostgreSQL writes every body in the email's row (large values
-- stay out of line, TOASTed, and a process of a version before reads a body only there), but
-- reads this table too: a store moved here from SQLite (mailsvc migrate-data) brings its rows.
CREATE TABLE email_bodies (
    email_seq  bigint PRIMARY KEY REFERENCES emails (seq),
    html       text,
    text       text
);
