//! Kafka: one consumer group per handler, records pumped in partition order
//! through the pipeline, and offsets told to Kafka only after the database.

mod blocked_keys;
pub mod consumer;
mod headers;
mod key_jobs;
mod keyed;
mod missing_topics;
mod outage;
mod partition;
pub mod pump;
pub mod relay;

pub use consumer::{InboxConsumer, create_consumer};
pub use pump::run_pump;
pub use relay::run_relay;
