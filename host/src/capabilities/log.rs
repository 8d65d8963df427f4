//! `inboxd:handler/log`: guest log lines into the host's log, tagged and bounded.

use crate::bindings::{Level, log_api, types_api};
use std::sync::Arc;
use wasmtime::component::HasData;

/// What every guest log line is tagged with, besides the event id.
#[derive(Debug)]
pub struct LogTag {
    pub handler: String,
    /// The version recorded on the event's inbox row.
    pub version: String,
}

pub struct LogState {
    tag: Arc<LogTag>,
    event_id: String,
    /// Bytes the guest may still log for this event; past it, lines are dropped and counted.
    budget: usize,
    dropped_lines: u64,
}

impl LogState {
    pub fn new(tag: Arc<LogTag>, event_id: String, budget: usize) -> Self {
        Self {
            tag,
            event_id,
            budget,
            dropped_lines: 0,
        }
    }

    pub fn dropped_lines(&self) -> u64 {
        self.dropped_lines
    }
}

pub struct LogCap;

impl HasData for LogCap {
    type Data<'a> = LogView<'a>;
}

pub struct LogView<'a> {
    pub state: &'a mut LogState,
}

impl types_api::Host for LogView<'_> {}

impl log_api::Host for LogView<'_> {
    fn log(&mut self, level: Level, message: String) {
        let state = &mut *self.state;
        // Every line costs its bytes plus one, so a flood of empty lines
        // spends the budget too.
        let cost = message.len() + 1;
        if cost > state.budget {
            state.dropped_lines += 1;
            return;
        }
        state.budget -= cost;
        let (handler, version) = (state.tag.handler.as_str(), state.tag.version.as_str());
        let event_id = state.event_id.as_str();
        match level {
            Level::Trace => tracing::trace!(target: "guest", handler, version, event_id, "{message}"),
            Level::Debug => tracing::debug!(target: "guest", handler, version, event_id, "{message}"),
            Level::Info => tracing::info!(target: "guest", handler, version, event_id, "{message}"),
            Level::Warn => tracing::warn!(target: "guest", handler, version, event_id, "{message}"),
            Level::Error => tracing::error!(target: "guest", handler, version, event_id, "{message}"),
        }
    }
}
