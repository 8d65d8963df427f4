-- One row per email "sent", standing in for the call to a mail service. No
-- unique key on purpose: the tests count rows to prove no invoice was emailed
-- twice. trace_id lets one order be followed from billing to here.
CREATE TABLE emails (
    event_id       TEXT NOT NULL,
    order_id       TEXT NOT NULL,
    customer_email TEXT NOT NULL,
    trace_id       TEXT
);
