//! One event in a transaction of its own: a record that failed in its batch
//! and is retried alone with backoff, or one the batch could not run with
//! the others. It claims, runs the handler, and seals or parks, as a batch
//! does for many ([`super::batch`]).

use super::guest::Call;
use super::tail::Sealed;
use super::{Fence, Outcome, Park, Pipeline, PipelineError};
use crate::config::RetryConfig;
use crate::db::business_keys;
use crate::db::dead_letters::ReasonKind;
use crate::db::inbox::{self, Claim};
use crate::db::{Tx, now_ms};
use crate::event_id;
use crate::handler::GuestFailure;
use crate::record::Record;
use rand::Rng;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What running one event inside an open transaction came to.
enum Step {
    /// The inbox already had its event id.
    Duplicate,
    /// It was claimed and the handler called (or refused, see [`Call`]).
    Ran(Call),
}

impl Pipeline {
    /// As [`Pipeline::process`], starting at `attempt` (a batch already ran
    /// the earlier ones).
    pub(super) async fn process_from(
        &self,
        record: &Record,
        fence: Fence,
        shutdown: &CancellationToken,
        mut attempt: u32,
        mut first_failed_at: Option<i64>,
    ) -> Result<Outcome, PipelineError> {
        let event_id = match event_id::of(&self.event_id, record) {
            Ok(id) => id,
            Err(error) => {
                let mut tx = self.db.begin_guest(self.handler.name()).await?;
                let letter = self.park_without_id(&mut tx, record, &error.to_string()).await?;
                return self.commit_parked(tx, record, fence, letter).await;
            }
        };
        let claim = self.claim(record, &event_id);
        loop {
            let tx = self.db.begin_guest(self.handler.name()).await?;
            let (mut tx, step) = self.step(tx, &claim, record, attempt).await?;
            let failure = match step {
                Step::Duplicate => {
                    if !self.finish(tx, record, fence, 1).await? {
                        return Ok(Outcome::Fenced);
                    }
                    self.stats.duplicates(1);
                    tracing::debug!(handler = claim.handler, event_id, "duplicate skipped");
                    return Ok(Outcome::Duplicate);
                }
                Step::Ran(Call::DuplicateByKey) => {
                    // Its claim commits: a redelivered copy is a plain duplicate.
                    if !self.finish(tx, record, fence, 1).await? {
                        return Ok(Outcome::Fenced);
                    }
                    self.stats.duplicates_by_key(1);
                    return Ok(Outcome::Duplicate);
                }
                Step::Ran(Call::TooLarge(reason)) => {
                    let letter = self
                        .park_claimed(&mut tx, &claim, record, Park::too_large(reason, record))
                        .await?;
                    return self.commit_parked(tx, record, fence, letter).await;
                }
                Step::Ran(Call::Applied(messages)) => {
                    let applied = [event_id.clone()];
                    match self.seal(tx, record, fence, 1, &applied, &messages).await? {
                        Sealed::Committed => {
                            self.stats.applied([record.timestamp_ms]);
                            return Ok(Outcome::Applied);
                        }
                        Sealed::Raced => return Ok(Outcome::Fenced),
                        Sealed::Violation(violation) => {
                            // Nothing of that transaction committed; park the event afresh.
                            let reason = format!("sandbox violation: {violation}");
                            tracing::error!(handler = claim.handler, event_id, "{reason}");
                            let park = Park {
                                kind: ReasonKind::SandboxViolation,
                                reason,
                                attempts: attempt,
                                first_failed_at: now_ms(),
                            };
                            return self.park_alone(&claim, record, fence, park).await;
                        }
                    }
                }
                Step::Ran(Call::Failed(failure)) => failure,
                Step::Ran(Call::Redo) => unreachable!("a lone event's transaction shares no savepoint"),
            };
            let first = *first_failed_at.get_or_insert_with(now_ms);
            if let Some(kind) = self.final_kind(&failure, attempt) {
                let park = Park {
                    kind,
                    reason: failure.to_string(),
                    attempts: attempt,
                    first_failed_at: first,
                };
                let letter = self.park_claimed(&mut tx, &claim, record, park).await?;
                return self.commit_parked(tx, record, fence, letter).await;
            }
            tx.rollback().await?;
            self.wait_to_retry(&event_id, attempt, &failure, shutdown).await?;
            attempt += 1;
        }
    }

    /// Claims the event and, the first time, runs the handler in `tx`.
    async fn step(
        &self,
        mut tx: Tx,
        claim: &Claim<'_>,
        record: &Record,
        attempt: u32,
    ) -> Result<(Tx, Step), PipelineError> {
        if !inbox::claim(&mut tx, claim).await? {
            return Ok((tx, Step::Duplicate));
        }
        // With `[handlers.dedup]`, its business key next: held by another
        // applied event inside its window, the handler is not run.
        if let Some((key, dedup)) = self.business_key(record) {
            let keys = [(key.as_str(), claim.event_id)];
            if !business_keys::claim_many(&mut tx, claim.handler, &keys, dedup.window)
                .await?
                .contains(claim.event_id)
            {
                tracing::debug!(
                    handler = claim.handler,
                    event_id = claim.event_id,
                    "duplicate by key skipped"
                );
                return Ok((tx, Step::Ran(Call::DuplicateByKey)));
            }
        }
        // A lost transaction needs nothing more here: the call failed (an
        // applied call on one is an error), and this transaction holds only
        // this event, so parking or retrying it works on the new one.
        let called = self.run_claimed(tx, claim, record, attempt).await?;
        Ok((called.tx, Step::Ran(called.call)))
    }

    /// `Some`: the failure is final and the event is parked with this kind.
    pub(super) fn final_kind(&self, failure: &GuestFailure, attempt: u32) -> Option<ReasonKind> {
        match failure {
            GuestFailure::Reject(_) => Some(ReasonKind::Rejected),
            _ if attempt >= self.retry.max_attempts => Some(ReasonKind::RetriesExhausted),
            _ => None,
        }
    }

    /// Logs the failure and waits out its backoff, unless shutdown comes first.
    pub(super) async fn wait_to_retry(
        &self,
        event_id: &str,
        attempt: u32,
        failure: &GuestFailure,
        shutdown: &CancellationToken,
    ) -> Result<(), PipelineError> {
        let delay = self.log_retry(event_id, attempt, failure);
        tokio::select! {
            _ = shutdown.cancelled() => Err(PipelineError::Abandoned),
            _ = tokio::time::sleep(delay) => Ok(()),
        }
    }

    /// Logs a failure to be retried; returns its backoff.
    pub(super) fn log_retry(&self, event_id: &str, attempt: u32, failure: &GuestFailure) -> Duration {
        let delay = backoff(&self.retry, attempt);
        tracing::warn!(
            handler = self.handler.name(),
            event_id,
            attempt,
            retry_in_ms = delay.as_millis() as u64,
            "{failure}; retrying"
        );
        delay
    }
}

/// Exponential backoff with "equal jitter": half fixed, half random, so
/// retries of many partitions after a shared outage spread out.
pub fn backoff(retry: &RetryConfig, attempt: u32) -> Duration {
    let exp = retry
        .backoff_initial_ms
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(20));
    let capped = exp.min(retry.backoff_max_ms);
    let jitter = rand::rng().random_range(0..=capped / 2);
    Duration::from_millis(capped - capped / 2 + jitter)
}
