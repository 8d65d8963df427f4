-- Outbox messages the broker will never accept (an invalid topic name, a
-- message over its size limit, a topic the relay may not write) are parked:
-- `parked_at` is set, the reason is in `last_error`, and the relay skips them
-- from then on, so they never hold back the messages after them. An operator
-- re-queues one (`parked_at` back to NULL) or discards it (`discarded_at`;
-- the row stays for the record until `outbox.retention` has passed).
ALTER TABLE outbox ADD COLUMN parked_at INTEGER;
ALTER TABLE outbox ADD COLUMN discarded_at INTEGER;

-- The relay reads only what it may send.
DROP INDEX outbox_pending;
CREATE INDEX outbox_pending ON outbox (bucket, seq) WHERE published_at IS NULL AND parked_at IS NULL;
CREATE INDEX outbox_parked ON outbox (handler, seq) WHERE parked_at IS NOT NULL;
