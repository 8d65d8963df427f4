//! Integration tests: the real `inboxd` binary against a real Kafka-protocol
//! broker (tansu, started by `scripts/test`) and a real database.
//!
//! Each test gets its own topic, consumer group and database, so tests run in
//! parallel without seeing each other's data. Every wait polls with a deadline.

mod admin;
mod bad_input;
mod browser;
mod chain;
mod chaos;
mod crash;
mod dead_letters;
mod dedup;
mod delivery;
mod faults;
mod instances;
mod languages;
mod limits;
mod ordering;
mod outbox_walls;
mod postgres;
mod retention;
mod sandbox;
mod support;
mod traces;
