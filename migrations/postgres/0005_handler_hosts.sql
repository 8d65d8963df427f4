-- Which host runs which handler, as each host last said: every host rewrites
-- its own rows every few seconds and deletes them when it stops, so the
-- operator console can show the hosts behind a handler. A row not refreshed
-- for a minute belongs to a host that died: readers ignore it, and any host
-- deletes it after an hour (hosts' clocks may disagree by more than a minute).
CREATE TABLE handler_hosts (
    host      TEXT    NOT NULL,
    handler   TEXT    NOT NULL,
    -- The version label the host records on its inbox rows.
    version   TEXT    NOT NULL,
    -- 1 while the host's consumer runs (0: paused or not started).
    consuming INTEGER NOT NULL,
    seen_at   BIGINT  NOT NULL,
    PRIMARY KEY (host, handler)
);

-- The console and /metrics count parked dead letters per handler every few
-- seconds; this keeps that from reading the whole table.
CREATE INDEX dead_letters_parked ON dead_letters (handler) WHERE resolution IS NULL;
