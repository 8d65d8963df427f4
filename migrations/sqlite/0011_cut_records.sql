-- A record past its handler's limits.max_payload_bytes as consumed is kept
-- only in part (issue 23, the seventeenth read of its third round: a
-- compressed record of a gigabyte's zeros was copied and parsed whole, and
-- the host was killed for memory at every restart). Its dead letter says how
-- large the record was; NULL: the letter keeps the record whole. A letter
-- with a size cannot be replayed.
ALTER TABLE dead_letters ADD COLUMN record_bytes INTEGER;
