-- Host-owned tables (design §6). Guests can never read or write these.
-- Times are Unix milliseconds, the same on every backend.

-- One row per (handler, event id) ever applied or dead-lettered. The primary
-- key is the deduplication: a second copy of an event fails to insert here.
CREATE TABLE inbox (
    handler         TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('done', 'dead')),
    topic           TEXT    NOT NULL,
    partition       INTEGER NOT NULL,
    "offset"        INTEGER NOT NULL,
    handler_version TEXT    NOT NULL,
    processed_at    INTEGER NOT NULL,
    -- The UTC day of a UUIDv7 event id's timestamp (0 for other ids). Only
    -- PostgreSQL partitions on it; kept here so the host's SQL is one text.
    id_day          INTEGER NOT NULL,
    PRIMARY KEY (handler, event_id)
) WITHOUT ROWID;

-- Retention purges by age.
CREATE INDEX inbox_processed_at ON inbox (processed_at);

-- The source of truth for consumer positions: written in the same transaction
-- as the effects, and the consumer seeks here on assignment.
CREATE TABLE offsets (
    handler     TEXT    NOT NULL,
    topic       TEXT    NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    -- Records committed for this partition, across all hosts and restarts. With
    -- contiguous offsets from 0 it equals next_offset; more would mean an offset
    -- range was committed twice.
    records_committed INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (handler, topic, partition)
) WITHOUT ROWID;

-- Events that were not applied, with everything needed to inspect and replay them.
CREATE TABLE dead_letters (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    handler         TEXT    NOT NULL,
    event_id        TEXT,
    topic           TEXT    NOT NULL,
    partition       INTEGER NOT NULL,
    "offset"        INTEGER NOT NULL,
    key             BLOB,
    payload         BLOB    NOT NULL,
    headers         TEXT    NOT NULL,
    reason_kind     TEXT    NOT NULL,
    reason          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL,
    handler_version TEXT,
    first_failed_at INTEGER NOT NULL,
    last_failed_at  INTEGER NOT NULL,
    -- NULL while parked; 'replayed' or 'discarded' once an operator acted.
    resolution      TEXT,
    resolved_at     INTEGER
);

CREATE INDEX dead_letters_handler ON dead_letters (handler, id);

-- Which of each handler's own migrations have been applied.
CREATE TABLE handler_migrations (
    handler    TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    checksum   TEXT    NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (handler, version)
);

-- The tables each handler's migrations created: the only tables its SQL may
-- touch. (PostgreSQL needs no such list: a handler's tables are its schema.)
CREATE TABLE handler_tables (
    handler    TEXT NOT NULL,
    table_name TEXT NOT NULL,
    PRIMARY KEY (handler, table_name)
);

-- Messages handlers published, written in the handler's transaction and
-- relayed to Kafka after it commits. `bucket` (a hash of handler and key)
-- is the unit of ordering and of relay ownership; `bucket_seq` orders a
-- bucket's messages in commit order.
CREATE TABLE outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT    NOT NULL UNIQUE,
    handler      TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    key          BLOB,
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL,
    bucket       INTEGER NOT NULL,
    bucket_seq   INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    published_at INTEGER,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT
);

CREATE INDEX outbox_pending ON outbox (bucket, bucket_seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;

-- Per-bucket sequence numbers. A handler's transaction that publishes locks
-- its bucket's row until it commits, so bucket_seq order is commit order.
CREATE TABLE outbox_sequences (
    bucket   INTEGER PRIMARY KEY,
    next_seq INTEGER NOT NULL
);

-- Which host relays which bucket, until when (a dead host's lease runs out).
CREATE TABLE outbox_leases (
    bucket      INTEGER PRIMARY KEY,
    owner       TEXT,
    lease_until INTEGER NOT NULL
);

WITH RECURSIVE b(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM b WHERE n < 63)
INSERT INTO outbox_sequences SELECT n, 0 FROM b;
WITH RECURSIVE b(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM b WHERE n < 63)
INSERT INTO outbox_leases SELECT n, NULL, 0 FROM b;
