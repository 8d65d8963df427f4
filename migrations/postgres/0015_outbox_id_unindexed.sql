-- The outbox's message ids lose their UNIQUE index (issue 24).
--
-- Each id is a UUIDv7 the host draws when a handler publishes (74 random
-- bits besides the time), so they are unique by construction, and nothing
-- looks a message up by its id: the relay, the purge and the admin API go
-- by seq. The index was a third of the cost of writing a message
-- (PostgreSQL 15, 90 messages per statement: 6.2 µs per row with it, 3.9
-- without), paid again by the relay's delete.
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_id_key;
