-- Host-owned tables (design §6), mirroring migrations/sqlite. Guests can never
-- read or write these. Times are Unix milliseconds, the same on every backend.

-- Partitioned by id_day, the UTC day of a UUIDv7 event id's timestamp (0 for
-- any other id). A partitioned table's unique key must include the partition
-- column; id_day is a pure function of event_id, so (handler, event_id, id_day)
-- is unique exactly when (handler, event_id) is, and dedup stays exact however
-- the partitions are laid out. Rows go to the DEFAULT partition unless the host
-- created a daily partition for their day (inbox.partitioning = "daily"), and
-- such daily partitions are dropped whole once past retention.
CREATE TABLE inbox (
    handler         TEXT   NOT NULL,
    event_id        TEXT   NOT NULL,
    status          TEXT   NOT NULL CHECK (status IN ('done', 'dead')),
    topic           TEXT   NOT NULL,
    partition       INTEGER NOT NULL,
    "offset"        BIGINT NOT NULL,
    handler_version TEXT   NOT NULL,
    processed_at    BIGINT NOT NULL,
    id_day          INTEGER NOT NULL,
    PRIMARY KEY (handler, event_id, id_day)
) PARTITION BY RANGE (id_day);

CREATE TABLE inbox_default PARTITION OF inbox DEFAULT;

CREATE INDEX inbox_processed_at ON inbox (processed_at);

CREATE TABLE offsets (
    handler     TEXT    NOT NULL,
    topic       TEXT    NOT NULL,
    partition   INTEGER NOT NULL,
    next_offset BIGINT NOT NULL,
    -- Records committed for this partition, across all hosts and restarts. With
    -- contiguous offsets from 0 it equals next_offset; more would mean an offset
    -- range was committed twice.
    records_committed BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (handler, topic, partition)
);

CREATE TABLE dead_letters (
    id              BIGSERIAL PRIMARY KEY,
    handler         TEXT    NOT NULL,
    event_id        TEXT,
    topic           TEXT    NOT NULL,
    partition       INTEGER NOT NULL,
    "offset"        BIGINT  NOT NULL,
    key             BYTEA,
    payload         BYTEA   NOT NULL,
    headers         TEXT    NOT NULL,
    reason_kind     TEXT    NOT NULL,
    reason          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL,
    handler_version TEXT,
    first_failed_at BIGINT  NOT NULL,
    last_failed_at  BIGINT  NOT NULL,
    -- NULL while parked; 'replayed' or 'discarded' once an operator acted.
    resolution      TEXT,
    resolved_at     BIGINT
);

CREATE INDEX dead_letters_handler ON dead_letters (handler, id);

CREATE TABLE handler_migrations (
    handler    TEXT    NOT NULL,
    version    BIGINT  NOT NULL,
    name       TEXT    NOT NULL,
    checksum   TEXT    NOT NULL,
    applied_at BIGINT  NOT NULL,
    PRIMARY KEY (handler, version)
);

-- Messages handlers published (see migrations/sqlite for the design).
CREATE TABLE outbox (
    seq          BIGSERIAL PRIMARY KEY,
    id           TEXT    NOT NULL UNIQUE,
    handler      TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    key          BYTEA,
    payload      BYTEA   NOT NULL,
    headers      TEXT    NOT NULL,
    bucket       INTEGER NOT NULL,
    bucket_seq   BIGINT  NOT NULL,
    created_at   BIGINT  NOT NULL,
    published_at BIGINT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT
);

CREATE INDEX outbox_pending ON outbox (bucket, bucket_seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;

CREATE TABLE outbox_sequences (
    bucket   INTEGER PRIMARY KEY,
    next_seq BIGINT  NOT NULL
);

CREATE TABLE outbox_leases (
    bucket      INTEGER PRIMARY KEY,
    owner       TEXT,
    lease_until BIGINT  NOT NULL
);

INSERT INTO outbox_sequences SELECT n, 0 FROM generate_series(0, 63) n;
INSERT INTO outbox_leases SELECT n, NULL, 0 FROM generate_series(0, 63) n;
