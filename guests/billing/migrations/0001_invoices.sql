-- One row per confirmed order. Deliberately no unique key on event_id or
-- order_id: deduplication is the host's job, and the tests count these rows to
-- prove that no event was applied twice.
CREATE TABLE invoices (
    order_id       TEXT   NOT NULL,
    customer_email TEXT   NOT NULL,
    amount_cents   BIGINT NOT NULL,
    event_id       TEXT   NOT NULL
);
