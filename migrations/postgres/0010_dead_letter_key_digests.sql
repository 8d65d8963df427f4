-- Key order looks parked letters up by Kafka key. A btree entry holds at
-- most 2,704 bytes, and a random key does not compress, so a record with a
-- 3 KB key could never be parked ("index row size exceeds btree maximum"):
-- its partition retried it for good (issue 23, the thirteenth read of its
-- third round). The index keeps the key's SHA-256; lookups compare the
-- digest (which the index serves) and then the key itself. Offset and id
-- follow, so the first letter of a key is the first entry read (not every
-- letter of the key, each key read whole), and only letters that block a
-- key are in it (letters without an event id are parked without a guest
-- call, as many as a team sends, and were read by every lookup).
DROP INDEX dead_letters_open_keys;
CREATE INDEX dead_letters_open_keys
    ON dead_letters (handler, topic, partition, pg_catalog.sha256(key), "offset", id)
    WHERE resolution IS NULL AND event_id IS NOT NULL AND key IS NOT NULL;

CREATE OR REPLACE FUNCTION inboxd_gate.blocked_keys(host_key TEXT, p_handler TEXT, p_topic TEXT,
    p_partition INTEGER, keys JSON)
RETURNS SETOF TEXT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    RETURN QUERY SELECT DISTINCT encode(d.key, 'hex')
    FROM json_array_elements_text(keys) AS k(hex)
    JOIN inboxd.dead_letters AS d
      ON pg_catalog.sha256(d.key) = pg_catalog.sha256(decode(k.hex, 'hex')) AND d.key = decode(k.hex, 'hex')
    WHERE d.handler = p_handler AND d.topic = p_topic AND d.partition = p_partition
      AND d.resolution IS NULL AND d.event_id IS NOT NULL AND d.key IS NOT NULL;
END $$;
