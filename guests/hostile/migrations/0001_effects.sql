-- Rows written by the well-behaved "ok" attack, so tests can see that the event
-- after a hostile one was still processed.
CREATE TABLE hostile_effects (
    event_id TEXT NOT NULL
);
