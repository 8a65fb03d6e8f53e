-- Operating it: the row a readiness probe writes, turns that one process at a time takes (the
-- purge of old mail), and an index that finds old mail by age.
CREATE TABLE probes (
    name  TEXT PRIMARY KEY,
    at    REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE turns (
    name   TEXT PRIMARY KEY,
    owner  TEXT NOT NULL,
    until  REAL NOT NULL
) WITHOUT ROWID;

CREATE INDEX emails_by_age ON emails (created_at);
