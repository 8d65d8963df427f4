//! Inboxd: effectively-once Kafka consumption.
//!
//! Each record's event id is claimed in an inbox table in the same local
//! transaction as the handler's effects and the partition's offset, so a
//! redelivered copy is skipped; handlers are sandboxed WebAssembly components
//! that only ever see that transaction. See `pipeline` for the heart of it.

pub mod admin;
pub mod bindings;
pub mod business_key;
pub mod capabilities;
pub mod cli;
pub mod config;
pub mod db;
pub mod event_id;
pub mod failpoints;
pub mod handler;
pub mod host;
pub mod json_field;
pub mod kafka;
#[cfg(test)]
mod layers;
pub mod metrics;
pub mod pipeline;
pub mod record;
pub mod registry;
pub mod replay;
pub mod retention;
pub mod sandbox;
pub mod shutdown;
pub mod stats;
pub mod telemetry;
pub mod wasm;
