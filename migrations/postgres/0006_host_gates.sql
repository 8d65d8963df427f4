-- The gates (issue 23): the host's own writes inside a transaction whose
-- session belongs to a handler.
--
-- Guest SQL runs on a session logged in as the handler's own role, a member of
-- nothing, so no RESET ROLE, SET ROLE or set_config('role', ...) can gain it
-- anything. That session has no privilege on the host's tables; the host's
-- claims, offsets, outbox messages, dead letters and migration records in the
-- same transaction go through these functions instead. Each runs as the host
-- (SECURITY DEFINER, with a fixed search path, pg_temp last) and first demands
-- a key that only a running host holds: the handler role may EXECUTE them, but
-- without the key every call fails. A host makes a random key when it starts
-- and stores only its SHA-256 here; the key itself travels as a bound
-- parameter, which no statement of the session can read back.
--
-- Each function is the one SQL text it replaces (see host/src/db/<table>.rs).

CREATE SCHEMA IF NOT EXISTS inboxd_gate;
REVOKE ALL ON SCHEMA inboxd_gate FROM PUBLIC;

CREATE TABLE handler_gate_keys (
    digest     BYTEA  PRIMARY KEY,
    created_at BIGINT NOT NULL
);

-- Login passwords of the handlers' roles, made by the host (never by a team).
CREATE TABLE handler_logins (
    handler  TEXT PRIMARY KEY,
    password TEXT NOT NULL
);

CREATE FUNCTION inboxd_gate.require_host(host_key TEXT) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    IF host_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM inboxd.handler_gate_keys WHERE digest = sha256(convert_to(host_key, 'UTF8'))
    ) THEN
        RAISE EXCEPTION 'inboxd: only the host may write the host''s tables'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- Defence in depth, should the key ever leak: a handler's own session may
-- write only that handler's rows, key or not (the host's own sessions, as
-- its login, any handler's).
CREATE FUNCTION inboxd_gate.require_handler(p_handler TEXT) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    IF session_user::text LIKE 'inboxd\_handler\_%'
       AND session_user::text IS DISTINCT FROM 'inboxd_handler_' || p_handler THEN
        RAISE EXCEPTION 'inboxd: a session of % may not write the rows of handler %', session_user, p_handler
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- inbox.rs: claim_many (and claim, one row). Returns the ids claimed now.
CREATE FUNCTION inboxd_gate.claim(host_key TEXT, claims JSON, claim_status TEXT) RETURNS SETOF TEXT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(d.handler)
    FROM (SELECT DISTINCT c.handler FROM json_to_recordset(claims) AS c(handler TEXT)) AS d;
    RETURN QUERY WITH claimed AS (
    INSERT INTO inboxd.inbox
    (handler, event_id, status, topic, partition, "offset", handler_version, processed_at, id_day)
    SELECT c.handler, c.event_id, claim_status, c.topic, c.partition, c."offset", c.handler_version,
           c.processed_at, c.id_day
    FROM json_to_recordset(claims) AS c(handler TEXT, event_id TEXT, topic TEXT, partition INTEGER,
        "offset" BIGINT, handler_version TEXT, processed_at BIGINT, id_day INTEGER)
    ORDER BY c.event_id COLLATE "C"
    ON CONFLICT DO NOTHING
    RETURNING inbox.event_id)
    SELECT claimed.event_id FROM claimed;
END $$;

-- inbox.rs: mark_dead's second half (the claim existed).
CREATE FUNCTION inboxd_gate.mark_dead(host_key TEXT, p_handler TEXT, p_event_id TEXT) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    UPDATE inboxd.inbox SET status = 'dead' WHERE handler = p_handler AND event_id = p_event_id;
END $$;

-- inbox.rs: unclaim (status 'done') and release_dead (status 'dead'). Returns rows deleted.
CREATE FUNCTION inboxd_gate.unclaim(host_key TEXT, p_handler TEXT, p_event_id TEXT, p_status TEXT) RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
DECLARE
    deleted BIGINT;
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    DELETE FROM inboxd.inbox WHERE handler = p_handler AND event_id = p_event_id AND status = p_status;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END $$;

-- inbox.rs: status; invariants.rs: claim_violation.
CREATE FUNCTION inboxd_gate.claim_status(host_key TEXT, p_handler TEXT, p_event_id TEXT) RETURNS TEXT
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    RETURN (SELECT status FROM inboxd.inbox WHERE handler = p_handler AND event_id = p_event_id);
END $$;

-- invariants.rs: the claims still 'done' and the partition's stored offset, in one call.
CREATE FUNCTION inboxd_gate.check_batch(host_key TEXT, p_handler TEXT, ids JSON, p_topic TEXT, p_partition INTEGER)
RETURNS TABLE (intact BIGINT, next_offset BIGINT)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    RETURN QUERY SELECT
        (SELECT COUNT(*) FROM json_to_recordset(ids) AS e(id TEXT, id_day INTEGER)
         CROSS JOIN LATERAL (SELECT 1 FROM inboxd.inbox i
             WHERE i.handler = p_handler AND i.event_id = e.id AND i.id_day = e.id_day AND i.status = 'done'
             LIMIT 1) AS found),
        (SELECT o.next_offset FROM inboxd.offsets o
         WHERE o.handler = p_handler AND o.topic = p_topic AND o.partition = p_partition);
END $$;

-- offsets.rs: advance. expected NULL: the first row; else a compare-and-set. Returns rows changed.
CREATE FUNCTION inboxd_gate.advance_offset(host_key TEXT, p_handler TEXT, p_topic TEXT, p_partition INTEGER,
    p_next_offset BIGINT, p_records BIGINT, p_updated_at BIGINT, p_expected BIGINT) RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
DECLARE
    changed BIGINT;
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    IF p_expected IS NULL THEN
        INSERT INTO inboxd.offsets (handler, topic, partition, next_offset, records_committed, updated_at)
        VALUES (p_handler, p_topic, p_partition, p_next_offset, p_records, p_updated_at)
        ON CONFLICT (handler, topic, partition) DO NOTHING;
    ELSE
        UPDATE inboxd.offsets
        SET next_offset = p_next_offset, records_committed = records_committed + p_records,
            updated_at = p_updated_at
        WHERE handler = p_handler AND topic = p_topic AND partition = p_partition
          AND next_offset = p_expected;
    END IF;
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
END $$;

-- outbox/mod.rs: insert (one JSON array of messages, key and payload in hex).
CREATE FUNCTION inboxd_gate.outbox_insert(host_key TEXT, p_handler TEXT, p_created_at BIGINT, messages JSON)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    INSERT INTO inboxd.outbox (id, handler, topic, key, payload, headers, bucket, created_at)
    SELECT m.id, p_handler, m.topic, decode(m.key, 'hex'), decode(m.payload, 'hex'), m.headers, m.bucket,
           p_created_at
    FROM json_to_recordset(messages) AS m(n INTEGER, id TEXT, topic TEXT, key TEXT, payload TEXT,
        headers TEXT, bucket INTEGER)
    ORDER BY m.n;
END $$;

-- dead_letters.rs: insert.
CREATE FUNCTION inboxd_gate.dead_letter(host_key TEXT, p_handler TEXT, p_event_id TEXT, p_topic TEXT,
    p_partition INTEGER, p_offset BIGINT, p_key BYTEA, p_payload BYTEA, p_headers TEXT, p_reason_kind TEXT,
    p_reason TEXT, p_attempts INTEGER, p_handler_version TEXT, p_first_failed_at BIGINT,
    p_last_failed_at BIGINT) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    INSERT INTO inboxd.dead_letters
    (handler, event_id, topic, partition, "offset", key, payload, headers, reason_kind, reason,
     attempts, handler_version, first_failed_at, last_failed_at)
    VALUES (p_handler, p_event_id, p_topic, p_partition, p_offset, p_key, p_payload, p_headers,
            p_reason_kind, p_reason, p_attempts, p_handler_version, p_first_failed_at, p_last_failed_at);
END $$;

-- dead_letters.rs: resolve. Returns rows changed.
CREATE FUNCTION inboxd_gate.resolve_dead_letter(host_key TEXT, p_id BIGINT, p_resolution TEXT, p_at BIGINT)
RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
DECLARE
    changed BIGINT;
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler((SELECT d.handler FROM inboxd.dead_letters d WHERE d.id = p_id));
    UPDATE inboxd.dead_letters SET resolution = p_resolution, resolved_at = p_at
    WHERE id = p_id AND resolution IS NULL;
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
END $$;

-- migrate/mod.rs: a handler migration's recorded checksum, and its record.
CREATE FUNCTION inboxd_gate.migration_checksum(host_key TEXT, p_handler TEXT, p_version BIGINT) RETURNS TEXT
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    RETURN (SELECT checksum FROM inboxd.handler_migrations WHERE handler = p_handler AND version = p_version);
END $$;

CREATE FUNCTION inboxd_gate.record_migration(host_key TEXT, p_handler TEXT, p_version BIGINT, p_name TEXT,
    p_checksum TEXT, p_applied_at BIGINT) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    INSERT INTO inboxd.handler_migrations (handler, version, name, checksum, applied_at)
    VALUES (p_handler, p_version, p_name, p_checksum, p_applied_at);
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA inboxd_gate FROM PUBLIC;
