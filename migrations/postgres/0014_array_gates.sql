-- A batch's claims, outbox messages and claim checks as arrays, and its
-- whole tail in one call (issue 24).
--
-- The gates of 0006 read a batch's rows from one JSON text, keys and payloads
-- in hex: PostgreSQL spent about a third of the outbox insert parsing it
-- (90 messages of 200 bytes: 9.3 µs per row from JSON, 5.8 from arrays), and
-- the host as much again writing it. These take a column per array, sent in
-- binary. The old gates stay (for a release) so a host from before still
-- runs while newer ones migrate the database; each host grants its
-- handlers' roles every gate when it prepares them, and the DO block below
-- grants the new ones to whoever may call the old.

-- inbox.rs: claim_many. Returns the ids claimed now.
CREATE FUNCTION inboxd_gate.claim_rows(host_key TEXT, claim_status TEXT, p_processed_at BIGINT,
    p_handlers TEXT[], p_event_ids TEXT[], p_topics TEXT[], p_partitions BIGINT[], p_offsets BIGINT[],
    p_handler_versions TEXT[], p_id_days BIGINT[]) RETURNS SETOF TEXT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(d.handler)
    FROM (SELECT DISTINCT h AS handler FROM unnest(p_handlers) AS h) AS d;
    RETURN QUERY WITH claimed AS (
    INSERT INTO inboxd.inbox
    (handler, event_id, status, topic, partition, "offset", handler_version, processed_at, id_day)
    SELECT c.handler, c.event_id, claim_status, c.topic, c.partition, c."offset", c.handler_version,
           p_processed_at, c.id_day
    FROM unnest(p_handlers, p_event_ids, p_topics, p_partitions::INTEGER[], p_offsets, p_handler_versions,
        p_id_days::INTEGER[]) AS c(handler, event_id, topic, partition, "offset", handler_version, id_day)
    ORDER BY c.event_id COLLATE "C"
    ON CONFLICT DO NOTHING
    RETURNING inbox.event_id)
    SELECT claimed.event_id FROM claimed;
END $$;

-- invariants.rs: the claims still 'done' and the partition's stored offset, in one call.
CREATE FUNCTION inboxd_gate.check_batch_rows(host_key TEXT, p_handler TEXT, p_topic TEXT, p_partition INTEGER,
    p_ids TEXT[], p_id_days BIGINT[])
RETURNS TABLE (intact BIGINT, next_offset BIGINT)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    RETURN QUERY SELECT
        (SELECT COUNT(*) FROM unnest(p_ids, p_id_days::INTEGER[]) AS e(id, id_day)
         CROSS JOIN LATERAL (SELECT 1 FROM inboxd.inbox i
             WHERE i.handler = p_handler AND i.event_id = e.id AND i.id_day = e.id_day AND i.status = 'done'
             LIMIT 1) AS found),
        (SELECT o.next_offset FROM inboxd.offsets o
         WHERE o.handler = p_handler AND o.topic = p_topic AND o.partition = p_partition);
END $$;

-- outbox/mod.rs: insert, in the handler's publish order (the order seq
-- numbers them in). Returns the rows inserted.
CREATE FUNCTION inboxd_gate.outbox_insert_rows(host_key TEXT, p_handler TEXT, p_created_at BIGINT,
    p_ids TEXT[], p_topics TEXT[], p_keys BYTEA[], p_payloads BYTEA[], p_headers TEXT[], p_buckets BIGINT[])
RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
DECLARE
    inserted BIGINT;
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    INSERT INTO inboxd.outbox (id, handler, topic, key, payload, headers, bucket, created_at)
    SELECT m.id, p_handler, m.topic, m.key, m.payload, m.headers, m.bucket, p_created_at
    FROM unnest(p_ids, p_topics, p_keys, p_payloads, p_headers, p_buckets::INTEGER[]) WITH ORDINALITY
        AS m(id, topic, key, payload, headers, bucket, n)
    ORDER BY m.n;
    GET DIAGNOSTICS inserted = ROW_COUNT;
    RETURN inserted;
END $$;

-- pipeline/tail.rs: a consumer's batch's whole tail in one call, so one round
-- trip and one key check instead of three: its outbox messages (as
-- outbox_insert_rows), the check of its claims and of the partition's offset
-- (as check_batch_rows), and, only if both are as the host left them, the
-- offset's compare-and-set (as advance_offset). Returns the claims found
-- intact, the offset found, and the rows the advance changed (0: it was not
-- made, or another writer moved the offset first). Its statements repeat
-- those of the three gates on purpose: a helper without the key check would
-- be one a handler's session may call too (every function of this schema
-- is granted to the handlers' roles), and calling the gates themselves
-- checks the key three more times.
CREATE FUNCTION inboxd_gate.seal_rows(host_key TEXT, p_handler TEXT, p_created_at BIGINT,
    p_ids TEXT[], p_topics TEXT[], p_keys BYTEA[], p_payloads BYTEA[], p_headers TEXT[], p_buckets BIGINT[],
    p_claims TEXT[], p_claim_days BIGINT[], p_topic TEXT, p_partition INTEGER, p_next_offset BIGINT,
    p_records BIGINT, p_updated_at BIGINT, p_expected BIGINT)
RETURNS TABLE (s_intact BIGINT, s_offset BIGINT, s_advanced BIGINT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
DECLARE
    v_intact BIGINT;
    v_offset BIGINT;
    v_advanced BIGINT := 0;
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    INSERT INTO inboxd.outbox (id, handler, topic, key, payload, headers, bucket, created_at)
    SELECT m.id, p_handler, m.topic, m.key, m.payload, m.headers, m.bucket, p_created_at
    FROM unnest(p_ids, p_topics, p_keys, p_payloads, p_headers, p_buckets::INTEGER[]) WITH ORDINALITY
        AS m(id, topic, key, payload, headers, bucket, n)
    ORDER BY m.n;
    SELECT COUNT(*) INTO v_intact
    FROM unnest(p_claims, p_claim_days::INTEGER[]) AS e(id, id_day)
    CROSS JOIN LATERAL (SELECT 1 FROM inboxd.inbox i
        WHERE i.handler = p_handler AND i.event_id = e.id AND i.id_day = e.id_day AND i.status = 'done'
        LIMIT 1) AS found;
    SELECT o.next_offset INTO v_offset FROM inboxd.offsets o
    WHERE o.handler = p_handler AND o.topic = p_topic AND o.partition = p_partition;
    IF v_intact = pg_catalog.cardinality(p_claims) AND v_offset IS NOT DISTINCT FROM p_expected THEN
        IF p_expected IS NULL THEN
            INSERT INTO inboxd.offsets (handler, topic, partition, next_offset, records_committed, updated_at)
            VALUES (p_handler, p_topic, p_partition, p_next_offset, p_records, p_updated_at)
            ON CONFLICT (handler, topic, partition) DO NOTHING;
        ELSE
            UPDATE inboxd.offsets AS o
            SET next_offset = p_next_offset, records_committed = o.records_committed + p_records,
                updated_at = p_updated_at
            WHERE o.handler = p_handler AND o.topic = p_topic AND o.partition = p_partition
              AND o.next_offset = p_expected;
        END IF;
        GET DIAGNOSTICS v_advanced = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT v_intact, v_offset, v_advanced;
END $$;

REVOKE ALL ON FUNCTION inboxd_gate.seal_rows(TEXT, TEXT, BIGINT, TEXT[], TEXT[], BYTEA[], BYTEA[], TEXT[],
    BIGINT[], TEXT[], BIGINT[], TEXT, INTEGER, BIGINT, BIGINT, BIGINT, BIGINT) FROM PUBLIC;
REVOKE ALL ON FUNCTION inboxd_gate.claim_rows(TEXT, TEXT, BIGINT, TEXT[], TEXT[], TEXT[], BIGINT[], BIGINT[],
    TEXT[], BIGINT[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION inboxd_gate.check_batch_rows(TEXT, TEXT, TEXT, INTEGER, TEXT[], BIGINT[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION inboxd_gate.outbox_insert_rows(TEXT, TEXT, BIGINT, TEXT[], TEXT[], BYTEA[], BYTEA[],
    TEXT[], BIGINT[]) FROM PUBLIC;

-- Every role that may call the old claim gate may call the new ones.
DO $$
DECLARE grantee TEXT;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname
        FROM pg_catalog.pg_proc AS p
        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
        JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE p.oid = 'inboxd_gate.claim(text,json,text)'::pg_catalog.regprocedure
          AND a.privilege_type = 'EXECUTE'
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION inboxd_gate.claim_rows(text,text,int8,text[],text[],text[],int8[],int8[],text[],int8[]) TO %I', grantee);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION inboxd_gate.check_batch_rows(text,text,text,int4,text[],int8[]) TO %I', grantee);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION inboxd_gate.outbox_insert_rows(text,text,int8,text[],text[],bytea[],bytea[],text[],int8[]) TO %I', grantee);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION inboxd_gate.seal_rows(text,text,int8,text[],text[],bytea[],bytea[],text[],int8[],text[],int8[],text,int4,int8,int8,int8,int8) TO %I', grantee);
    END LOOP;
END $$;
