-- Business keys ([handlers.dedup]): the first event applied with a business
-- key (an order id) holds it until expires_at; another event with the key
-- before then is skipped as a duplicate by key. Written in the transaction
-- that claims the event id, released again when that event is parked or
-- retried. The retention purge deletes expired keys. Keys are stored as
-- business_key.rs writes them (`k:` and the key, or `h:` and a digest).
CREATE TABLE inbox_business_keys (
    handler      TEXT   NOT NULL,
    business_key TEXT   NOT NULL,
    event_id     TEXT   NOT NULL,
    expires_at   BIGINT NOT NULL,
    PRIMARY KEY (handler, business_key)
);
CREATE INDEX inbox_business_keys_expiry ON inbox_business_keys (expires_at);

-- business_keys.rs: claim_many. The claims come as one JSON array; they are
-- taken in key order (byte order, as Rust sorts them), so two batches with
-- overlapping keys lock them in the same order. Returns the event ids that
-- got their key: inserted, or taken over from a holder whose window passed.
CREATE FUNCTION inboxd_gate.claim_business_keys(host_key TEXT, p_handler TEXT, claims JSON, p_now BIGINT)
RETURNS SETOF TEXT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    RETURN QUERY WITH taken AS (
    INSERT INTO inboxd.inbox_business_keys AS k (handler, business_key, event_id, expires_at)
    SELECT p_handler, c.key, c.event_id, c.expires_at
    FROM json_to_recordset(claims) AS c(key TEXT, event_id TEXT, expires_at BIGINT)
    ORDER BY c.key COLLATE "C"
    ON CONFLICT (handler, business_key) DO UPDATE
    SET event_id = excluded.event_id, expires_at = excluded.expires_at
    WHERE k.expires_at <= p_now
    RETURNING k.event_id)
    SELECT taken.event_id FROM taken;
END $$;

-- business_keys.rs: release (the event that holds the key was parked or
-- will be retried: the key is free again).
CREATE FUNCTION inboxd_gate.release_business_key(host_key TEXT, p_handler TEXT, p_key TEXT, p_event_id TEXT)
RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
DECLARE
    changed BIGINT;
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    DELETE FROM inboxd.inbox_business_keys
    WHERE handler = p_handler AND business_key = p_key AND event_id = p_event_id;
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
END $$;

REVOKE ALL ON FUNCTION inboxd_gate.claim_business_keys(TEXT, TEXT, JSON, BIGINT) FROM PUBLIC;
REVOKE ALL ON FUNCTION inboxd_gate.release_business_key(TEXT, TEXT, TEXT, TEXT) FROM PUBLIC;
