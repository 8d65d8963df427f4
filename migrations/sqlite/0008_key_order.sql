-- ordering = "key": a record is held while a parked letter of its key in its
-- partition is unresolved; the host looks those up by key, for every batch.
CREATE INDEX dead_letters_open_keys ON dead_letters (handler, topic, partition, key) WHERE resolution IS NULL;
-- The records a handler holds (its max_held_records), counted in every hold.
CREATE INDEX dead_letters_held ON dead_letters (handler) WHERE resolution IS NULL AND reason_kind = 'held';
