-- SQLite stores a row's columns in order, and a value too large for its page
-- goes on a chain of overflow pages that can only be walked: reading any
-- column after a megabyte payload read the megabyte first. Every dead-letter
-- and parked-outbox list (up to 1,000 rows, none of which shows a payload)
-- read each row's payload and headers to reach the reason, the times and the
-- resolution after them (issue 23, the seventeenth read of its third round).
-- Both tables are rebuilt with key, payload and headers last; ids and
-- AUTOINCREMENT's high-water marks are kept, so no id is ever used twice.

CREATE TABLE dead_letters_new (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    handler         TEXT    NOT NULL,
    event_id        TEXT,
    topic           TEXT    NOT NULL,
    partition       INTEGER NOT NULL,
    "offset"        INTEGER NOT NULL,
    reason_kind     TEXT    NOT NULL,
    reason          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL,
    handler_version TEXT,
    first_failed_at INTEGER NOT NULL,
    last_failed_at  INTEGER NOT NULL,
    -- NULL while parked; 'replayed' or 'discarded' once an operator acted.
    resolution      TEXT,
    resolved_at     INTEGER,
    -- Set when the letter keeps only the first part of its record (0011).
    record_bytes    INTEGER,
    key             BLOB,
    headers         TEXT    NOT NULL,
    payload         BLOB    NOT NULL
);
INSERT INTO dead_letters_new (id, handler, event_id, topic, partition, "offset", reason_kind, reason, attempts,
    handler_version, first_failed_at, last_failed_at, resolution, resolved_at, record_bytes, key, headers, payload)
SELECT id, handler, event_id, topic, partition, "offset", reason_kind, reason, attempts,
    handler_version, first_failed_at, last_failed_at, resolution, resolved_at, record_bytes, key, headers, payload
FROM dead_letters;
UPDATE sqlite_sequence
SET seq = MAX(seq, COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'dead_letters'), 0))
WHERE name = 'dead_letters_new';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'dead_letters_new', seq FROM sqlite_sequence
WHERE name = 'dead_letters' AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'dead_letters_new');
DROP TABLE dead_letters;
ALTER TABLE dead_letters_new RENAME TO dead_letters;
CREATE INDEX dead_letters_handler ON dead_letters (handler, id);
CREATE INDEX dead_letters_parked ON dead_letters (handler) WHERE resolution IS NULL;
CREATE INDEX dead_letters_held ON dead_letters (handler) WHERE resolution IS NULL AND reason_kind = 'held';
CREATE INDEX dead_letters_open_keys ON dead_letters (handler, topic, partition, key, "offset", id)
    WHERE resolution IS NULL AND event_id IS NOT NULL AND key IS NOT NULL;

CREATE TABLE outbox_new (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT    NOT NULL UNIQUE,
    handler      TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    bucket       INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    published_at INTEGER,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    parked_at    INTEGER,
    discarded_at INTEGER,
    bytes        INTEGER,
    key          BLOB,
    headers      TEXT    NOT NULL,
    payload      BLOB    NOT NULL
);
INSERT INTO outbox_new (seq, id, handler, topic, bucket, created_at, published_at, attempts, last_error, parked_at,
    discarded_at, bytes, key, headers, payload)
SELECT seq, id, handler, topic, bucket, created_at, published_at, attempts, last_error, parked_at,
    discarded_at, bytes, key, headers, payload
FROM outbox;
UPDATE sqlite_sequence
SET seq = MAX(seq, COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0))
WHERE name = 'outbox_new';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'outbox_new', seq FROM sqlite_sequence
WHERE name = 'outbox' AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'outbox_new');
DROP TABLE outbox;
ALTER TABLE outbox_new RENAME TO outbox;
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;
CREATE INDEX outbox_parked ON outbox (handler, seq) WHERE parked_at IS NOT NULL;
CREATE INDEX outbox_pending ON outbox (bucket, seq, bytes) WHERE published_at IS NULL AND parked_at IS NULL;
