-- Key order's lookups of the letters that block a key (db/dead_letters/holds.rs):
-- offset and id follow the key, so the first letter of a key is the first
-- entry read, and only letters that block a key are in the index (letters
-- without an event id are parked without a guest call, as many as a team
-- sends, and were read by every lookup: issue 23, the fourteenth read of its
-- third round).
DROP INDEX dead_letters_open_keys;
CREATE INDEX dead_letters_open_keys ON dead_letters (handler, topic, partition, key, "offset", id)
    WHERE resolution IS NULL AND event_id IS NOT NULL AND key IS NOT NULL;

-- The registry compares a deployment's active version by number and upload
-- time (registry/store.rs `deployments`, read by every host every 2 s).
-- SQLite stores a row's columns in order, so reading `uploaded_at` from the
-- table walks the component's overflow pages before it (up to 100 MiB a
-- version); this index answers it alone.
CREATE INDEX handlers_uploaded_at ON handlers (name, version, uploaded_at);
