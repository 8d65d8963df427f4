-- Business keys ([handlers.dedup]): the first event applied with a business
-- key (an order id) holds it until expires_at; another event with the key
-- before then is skipped as a duplicate by key. Written in the transaction
-- that claims the event id, released again when that event is parked or
-- retried. The retention purge deletes expired keys.
CREATE TABLE inbox_business_keys (
    handler      TEXT   NOT NULL,
    business_key TEXT   NOT NULL,
    event_id     TEXT   NOT NULL,
    expires_at   BIGINT NOT NULL,
    PRIMARY KEY (handler, business_key)
);
CREATE INDEX inbox_business_keys_expiry ON inbox_business_keys (expires_at);

-- business_keys.rs: claim. 1 if the key is the event's now (new, expired,
-- or already its own), 0 if another event holds it inside its window.
CREATE FUNCTION inboxd_gate.claim_business_key(host_key TEXT, p_handler TEXT, p_key TEXT, p_event_id TEXT,
    p_expires_at BIGINT, p_now BIGINT) RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = inboxd, pg_catalog, pg_temp AS $$
DECLARE
    changed BIGINT;
BEGIN
    PERFORM inboxd_gate.require_host(host_key);
    PERFORM inboxd_gate.require_handler(p_handler);
    INSERT INTO inboxd.inbox_business_keys AS k (handler, business_key, event_id, expires_at)
    VALUES (p_handler, p_key, p_event_id, p_expires_at)
    ON CONFLICT (handler, business_key) DO UPDATE
    SET event_id = excluded.event_id, expires_at = excluded.expires_at
    WHERE k.expires_at <= p_now OR k.event_id = excluded.event_id;
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
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

REVOKE ALL ON FUNCTION inboxd_gate.claim_business_key(TEXT, TEXT, TEXT, TEXT, BIGINT, BIGINT) FROM PUBLIC;
REVOKE ALL ON FUNCTION inboxd_gate.release_business_key(TEXT, TEXT, TEXT, TEXT) FROM PUBLIC;
