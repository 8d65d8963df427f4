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
    /// What one call into the host may make it copy out of the guest
    /// ([`hostcall_bytes`]).
    pub hostcall_bytes: usize,
}

/// The least [`Limits::hostcall_bytes`]: a statement binding sixteen values
/// of the default row bound.
pub const HOSTCALL_FLOOR: usize = 16 << 20;

/// What one host call may carry from the guest: enough for a statement of
/// `max_statement_bytes` binding four values of `max_row_bytes`, a publish
/// of `max_outbox_bytes` (payload, key and headers), or the guest's output,
/// and at least [`HOSTCALL_FLOOR`]; never more than its memory. wasmtime
/// copies (and checks as UTF-8) what a call lifts before the host sees any
/// of it, on the runtime's worker: bounded by the memory alone, a guest of
/// 512 MiB had each `sql.execute` copy 512 MiB of aliased strings, a tenth
/// of a second of the worker every call (the forty-ninth read).
pub fn hostcall_bytes(c: &LimitsConfig) -> usize {
    let statement = c
        .max_statement_bytes
        .saturating_add(c.max_row_bytes.saturating_mul(4));
    let needed = statement
        .max(c.max_outbox_bytes.saturating_mul(2))
        .max(c.output_bytes);
    needed.max(HOSTCALL_FLOOR).min((c.memory_mb as usize) << 20)
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
            hostcall_bytes: hostcall_bytes(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_call_carries_what_the_limits_need_and_never_more_than_the_memory() {
        let defaults = LimitsConfig::default();
        assert_eq!(hostcall_bytes(&defaults), HOSTCALL_FLOOR);
        let large = LimitsConfig {
            memory_mb: 512,
            max_row_bytes: 8 << 20,
            max_outbox_bytes: 8 << 20,
            max_statement_bytes: 1 << 20,
            ..LimitsConfig::default()
        };
        assert_eq!(hostcall_bytes(&large), (1 << 20) + 4 * (8 << 20));
        let small = LimitsConfig {
            memory_mb: 8,
            ..LimitsConfig::default()
        };
        assert_eq!(hostcall_bytes(&small), 8 << 20);
    }
}
