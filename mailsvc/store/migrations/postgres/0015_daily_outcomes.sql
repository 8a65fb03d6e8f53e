-- The dashboard's chart of an account's last days, kept as counters: what happened to its mail
-- on each day (emails sent or failed, recipients bounced or complained), added to in the same
-- transaction that records the outcome. Reading 14 days is at most 14 x 4 x 8 rows at any size.
-- A hot account's counters are spread over 8 shards (the email's seq), so that two deliveries
-- of one account rarely wait on one row.
DROP INDEX emails_by_account_and_age;
CREATE TABLE daily_outcomes (
    account_id  text NOT NULL,
    day         integer NOT NULL,
    outcome     text NOT NULL,
    shard       integer NOT NULL,
    count       bigint NOT NULL,
    PRIMARY KEY (account_id, day, outcome, shard)
);
-- What happened before the counters, from the timelines.
INSERT INTO daily_outcomes (account_id, day, outcome, shard, count)
    SELECT emails.account_id, floor(events.at / 86400)::integer,
           CASE events.type WHEN 'partially_sent' THEN 'sent' ELSE events.type END,
           emails.seq % 8, count(*)
    FROM events JOIN emails ON emails.seq = events.email_seq
    WHERE events.type IN ('sent', 'partially_sent', 'failed', 'bounced', 'complained')
    GROUP BY 1, 2, 3, 4;
