//! A handler's resource limits, resolved from its `[handlers.limits]`.
//!
//! Every bound a guest can hit is named by its config key, so a dead letter's
//! reason tells the handler's author exactly which knob to look at.

use crate::config::LimitsConfig;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Limits {
    pub timeout: Duration,
    pub memory_bytes: usize,
    pub output_bytes: usize,
    pub max_statements: u32,
    pub max_rows: usize,
    pub max_result_bytes: usize,
    pub max_payload_bytes: usize,
    pub max_outbox_messages: usize,
    pub max_outbox_bytes: usize,
}

impl From<&LimitsConfig> for Limits {
    fn from(c: &LimitsConfig) -> Self {
        Self {
            timeout: Duration::from_millis(c.timeout_ms),
            memory_bytes: (c.memory_mb as usize) << 20,
            output_bytes: c.output_bytes,
            max_statements: c.max_statements,
            max_rows: c.max_rows,
            max_result_bytes: c.max_result_bytes,
            max_payload_bytes: c.max_payload_bytes,
            max_outbox_messages: c.max_outbox_messages,
            max_outbox_bytes: c.max_outbox_bytes,
        }
    }
}
