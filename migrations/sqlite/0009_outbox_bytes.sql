-- The relay sizes pending messages before it reads them (db/outbox/pending.rs).
-- SQLite stores a row's columns in order, so reaching the headers, stored
-- after the payload, walks the payload's overflow pages: 0.7 s per 1.6 GB
-- pending, on every look. The size is now written with the message and kept
-- in the pending index, so the sizing reads the index alone (3 ms). Rows
-- from before have none and are sized the slow way.
ALTER TABLE outbox ADD COLUMN bytes INTEGER;
DROP INDEX outbox_pending;
CREATE INDEX outbox_pending ON outbox (bucket, seq, bytes) WHERE published_at IS NULL AND parked_at IS NULL;
