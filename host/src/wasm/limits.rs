//! Per-handler resource limits and the memory limiter that enforces them.
//!
//! Every bound a guest can hit is named by its config key, so a dead letter's
//! reason tells the handler's author exactly which knob to look at.

use crate::handler::LimitExceeded;
use std::time::Duration;

/// How often the epoch ticker advances. The time limit is enforced to within
/// one tick, and a running guest yields to the runtime once per tick; 10 ms
/// keeps the ticker's cost negligible on a 2-core machine.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Tables (function references) a guest may grow to. Real components use a few hundred.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Caps the total linear memory of all of a guest's memories (a Python
/// component has several core instances, each with its own memory).
pub struct MemoryLimiter {
    max_bytes: usize,
    total_bytes: usize,
    exceeded: Option<LimitExceeded>,
}

impl MemoryLimiter {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            total_bytes: 0,
            exceeded: None,
        }
    }

    /// The guest's linear memory now, all memories together.
    pub fn total_bytes(&self) -> usize {
        self.total_bytes
    }

    /// Set once the guest asked for more than its limit; the trap that
    /// usually follows (an allocation failure) is then reported as this.
    pub fn exceeded(&self) -> Option<&LimitExceeded> {
        self.exceeded.as_ref()
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.total_bytes - current + desired;
        if total > self.max_bytes {
            self.exceeded = Some(LimitExceeded {
                key: "limits.memory_mb",
                detail: format!(
                    "the guest asked for {} MiB of linear memory; the limit is {} MiB",
                    total.div_ceil(1 << 20),
                    self.max_bytes >> 20
                ),
            });
            return Ok(false);
        }
        self.total_bytes = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn memory_total_counts_every_memory_and_names_the_key() {
        let mut limiter = MemoryLimiter::new(10 << 20);
        assert!(limiter.memory_growing(0, 6 << 20, None).unwrap());
        assert!(limiter.memory_growing(0, 3 << 20, None).unwrap());
        assert!(!limiter.memory_growing(3 << 20, 5 << 20, None).unwrap());
        let exceeded = limiter.exceeded().unwrap();
        assert_eq!(exceeded.key, "limits.memory_mb");
        assert!(exceeded.to_string().contains("limit is 10 MiB"), "{exceeded}");
    }
}
