-- The handler's own tables: only this handler's SQL can reach them. On
-- PostgreSQL they live in its own schema; on SQLite every handler's tables
-- share one namespace, so the name starts with the handler's. No unique key
-- on event_id is needed: the host's inbox already makes each event apply once.
CREATE TABLE {{name}}_orders (
    order_id     TEXT   NOT NULL,
    amount_cents BIGINT NOT NULL,
    event_id     TEXT   NOT NULL
);
