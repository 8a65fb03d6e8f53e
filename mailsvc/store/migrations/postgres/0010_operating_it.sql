-- Operating it: the row a readiness probe writes, turns that one process at a time takes (the
-- purge of old mail), and an index that finds old mail by age.
CREATE TABLE probes (
    name  text PRIMARY KEY,
    at    double precision NOT NULL
);

CREATE TABLE turns (
    name   text PRIMARY KEY,
    owner  text NOT NULL,
    until  double precision NOT NULL
);

CREATE INDEX emails_by_age ON emails (created_at);
