-- A record past its handler's limits.max_payload_bytes as consumed is kept
-- only in part (issue 23, the seventeenth read of its third round: a
-- compressed record of a gigabyte's zeros was copied and parsed whole, and
-- the host was killed for memory at every restart). Its dead letter says how
-- large the record was; NULL: the letter keeps the record whole. A letter
-- with a size cannot be replayed. (A nullable column without a default is
-- added without rewriting the table.)
ALTER TABLE dead_letters ADD COLUMN record_bytes BIGINT;

-- The dead letters' gate takes the size: a new function beside the old one,
-- which stays (for a release) as a wrapper that passes none, so a host from
-- before still parks its events while newer ones migrate the database.
CREATE FUNCTION inboxd_gate.dead_letter(host_key TEXT, p_handler TEXT, p_event_id TEXT, p_topic TEXT,
    p_partition INTEGER, p_offset BIGINT, p_key BYTEA, p_payload BYTEA, p_headers TEXT, p_reason_kind TEXT,
    p_reason TEXT, p_attempts INTEGER, p_handler_version TEXT, p_first_failed_at BIGINT,
    p_last_failed_at BIGINT, p_record_bytes BIGINT) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    INSERT INTO inboxd.dead_letters
    (handler, event_id, topic, partition, "offset", key, payload, headers, reason_kind, reason,
     attempts, handler_version, first_failed_at, last_failed_at, record_bytes)
    VALUES (p_handler, p_event_id, p_topic, p_partition, p_offset, p_key, p_payload, p_headers,
            p_reason_kind, p_reason, p_attempts, p_handler_version, p_first_failed_at, p_last_failed_at,
            p_record_bytes);
END $$;

CREATE OR REPLACE FUNCTION inboxd_gate.dead_letter(host_key TEXT, p_handler TEXT, p_event_id TEXT, p_topic TEXT,
    p_partition INTEGER, p_offset BIGINT, p_key BYTEA, p_payload BYTEA, p_headers TEXT, p_reason_kind TEXT,
    p_reason TEXT, p_attempts INTEGER, p_handler_version TEXT, p_first_failed_at BIGINT,
    p_last_failed_at BIGINT) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.dead_letter(host_key, p_handler, p_event_id, p_topic, p_partition, p_offset, p_key,
        p_payload, p_headers, p_reason_kind, p_reason, p_attempts, p_handler_version, p_first_failed_at,
        p_last_failed_at, NULL::pg_catalog.int8);
END $$;

REVOKE ALL ON FUNCTION inboxd_gate.dead_letter(TEXT, TEXT, TEXT, TEXT, INTEGER, BIGINT, BYTEA, BYTEA, TEXT,
    TEXT, TEXT, INTEGER, TEXT, BIGINT, BIGINT, BIGINT) FROM PUBLIC;

-- Every role that may call the old gate may call the new one (each host also
-- grants its handlers' roles every gate when it prepares them).
DO $$
DECLARE grantee TEXT;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname
        FROM pg_catalog.pg_proc AS p
        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
        JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
        WHERE p.oid = 'inboxd_gate.dead_letter(text,text,text,text,int4,int8,bytea,bytea,text,text,text,int4,text,int8,int8)'::pg_catalog.regprocedure
          AND a.privilege_type = 'EXECUTE'
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION inboxd_gate.dead_letter(text,text,text,text,int4,int8,bytea,bytea,text,text,text,int4,text,int8,int8,int8) TO %I', grantee);
    END LOOP;
END $$;
