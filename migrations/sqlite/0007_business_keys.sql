-- Business keys ([handlers.dedup]): the first event applied with a business
-- key (an order id) holds it until expires_at; another event with the key
-- before then is skipped as a duplicate by key. Written in the transaction
-- that claims the event id, released again when that event is parked or
-- retried. The retention purge deletes expired keys. Keys are stored as
-- business_key.rs writes them (`k:` and the key, or `h:` and a digest). (Numbered after
-- PostgreSQL's 0006, the gates, which SQLite does not need.)
CREATE TABLE inbox_business_keys (
    handler      TEXT   NOT NULL,
    business_key TEXT   NOT NULL,
    event_id     TEXT   NOT NULL,
    expires_at   BIGINT NOT NULL,
    PRIMARY KEY (handler, business_key)
);
CREATE INDEX inbox_business_keys_expiry ON inbox_business_keys (expires_at);
