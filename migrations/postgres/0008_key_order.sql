-- ordering = "key": a record is held while a parked letter of its key in its
-- partition is unresolved; the host looks those up by key, for every batch.
CREATE INDEX dead_letters_open_keys ON dead_letters (handler, topic, partition, key) WHERE resolution IS NULL;
-- The records a handler holds (its max_held_records), counted in every hold.
CREATE INDEX dead_letters_held ON dead_letters (handler) WHERE resolution IS NULL AND reason_kind = 'held';

-- dead_letters.rs: blocked_among. Of `keys` (a JSON array of hex), those a
-- parked letter with an event id blocks in this partition (hex). Read in the
-- batch's transaction after its claims, so a letter another consumer parked
-- meanwhile (a rebalance) is seen.
CREATE FUNCTION inboxd_gate.blocked_keys(host_key TEXT, p_handler TEXT, p_topic TEXT, p_partition INTEGER,
    keys JSON)
RETURNS SETOF TEXT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    RETURN QUERY SELECT DISTINCT encode(d.key, 'hex')
    FROM json_array_elements_text(keys) AS k(hex)
    JOIN inboxd.dead_letters AS d ON d.key = decode(k.hex, 'hex')
    WHERE d.handler = p_handler AND d.topic = p_topic AND d.partition = p_partition
      AND d.resolution IS NULL AND d.event_id IS NOT NULL;
END $$;

REVOKE ALL ON FUNCTION inboxd_gate.blocked_keys(TEXT, TEXT, TEXT, INTEGER, JSON) FROM PUBLIC;
