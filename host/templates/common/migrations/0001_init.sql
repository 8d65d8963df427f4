-- The handler's own tables. They live in its own schema (PostgreSQL) or
-- namespace (SQLite), and only this handler's SQL can reach them. No unique
-- key on event_id is needed: the host's inbox already makes each event apply
-- once.
CREATE TABLE orders (
    order_id     TEXT   NOT NULL,
    amount_cents BIGINT NOT NULL,
    event_id     TEXT   NOT NULL
);
