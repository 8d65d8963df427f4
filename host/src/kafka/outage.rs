//! Database outages as the pump sees them: retried with backoff until they
//! end, and logged once when one starts and once when it ends, however many
//! partitions' batches are waiting it out together.

use crate::config::RetryConfig;
use crate::pipeline::{PipelineError, backoff};
use std::sync::Mutex;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Backoff for the host's own retries (database outages, broker errors).
const HOST_RETRY: RetryConfig = RetryConfig {
    max_attempts: u32::MAX,
    backoff_initial_ms: 100,
    backoff_max_ms: 5_000,
};

/// Shared by one handler's pump and its batches.
#[derive(Default)]
pub struct OutageLog {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Tasks currently retrying; the outage ends when the last one succeeds.
    failing: usize,
    since: Option<Instant>,
}

impl OutageLog {
    /// Runs `step` until it succeeds; `None` if shutdown came first or the
    /// step abandoned its work for shutdown.
    pub async fn retry<T, F, Fut>(&self, what: &str, shutdown: &CancellationToken, mut step: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, PipelineError>>,
    {
        let mut attempt = Attempt::new(self);
        loop {
            match step().await {
                Ok(value) => {
                    attempt.succeeded(what);
                    return Some(value);
                }
                Err(PipelineError::Abandoned) => return None,
                Err(error) => {
                    if !attempt.failed(what, &error, shutdown).await {
                        return None;
                    }
                }
            }
        }
    }
}

/// One task's run of failures, counted in the shared log while it lasts.
pub struct Attempt<'a> {
    log: &'a OutageLog,
    failures: u32,
}

impl<'a> Attempt<'a> {
    pub fn new(log: &'a OutageLog) -> Self {
        Self { log, failures: 0 }
    }

    pub fn succeeded(&mut self, what: &str) {
        if self.failures == 0 {
            return;
        }
        let mut state = self.log.state.lock().unwrap_or_else(|p| p.into_inner());
        state.failing -= 1;
        if state.failing == 0
            && let Some(since) = state.since.take()
        {
            tracing::info!(
                outage_ms = since.elapsed().as_millis() as u64,
                "database is back; resumed {what}"
            );
        }
        self.failures = 0;
    }

    /// Logs the start of an outage (once for all tasks) and waits out the
    /// backoff; `false` if shutdown came first.
    pub async fn failed(&mut self, what: &str, error: &PipelineError, shutdown: &CancellationToken) -> bool {
        if self.failures == 0 {
            let mut state = self.log.state.lock().unwrap_or_else(|p| p.into_inner());
            state.failing += 1;
            if state.failing == 1 && state.since.is_none() {
                state.since = Some(Instant::now());
                tracing::warn!("{what} failed, retrying with backoff until it succeeds: {error}");
            }
        }
        self.failures += 1;
        tokio::select! {
            _ = shutdown.cancelled() => false,
            _ = tokio::time::sleep(backoff(&HOST_RETRY, self.failures.min(16))) => true,
        }
    }
}

impl Drop for Attempt<'_> {
    /// A task that gives up (shutdown) no longer holds the outage open.
    fn drop(&mut self) {
        if self.failures > 0 {
            let mut state = self.log.state.lock().unwrap_or_else(|p| p.into_inner());
            state.failing -= 1;
            if state.failing == 0 {
                state.since = None;
            }
        }
    }
}
