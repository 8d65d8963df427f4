//! The inbox transaction for one record: claim -> invoke -> offset -> commit.
//!
//! This is where the promise of design §1 is kept. For each record, in ONE
//! transaction: claim `(handler, event id)` in the inbox (a duplicate stops
//! here), run the guest on the same transaction inside a savepoint, write the
//! partition's next offset, and commit. A record that cannot succeed is parked
//! in `dead_letters` in the same way, so every record ends applied once or
//! parked with its reason. Only after `process` returns does the caller tell
//! Kafka anything.
//!
//! One record per transaction for now; batching (issue 7) groups several
//! records' savepoints into one transaction without changing this contract.

use crate::config::{EventIdConfig, RetryConfig};
use crate::db::dead_letters::{self, DeadLetter, ReasonKind};
use crate::db::inbox::{self, Claim};
use crate::db::{Database, DbError, Tx, invariants, now_ms, offsets, outbox};
use crate::event_id;
use crate::record::Record;
use crate::sandbox::authorizer::Scope;
use crate::stats::Stats;
use crate::wasm::{GuestFailure, HandlerComponent};
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The savepoint around a guest's statements: a failed guest is undone without
/// losing the claim, so its dead letter commits with the claim.
const GUEST_SAVEPOINT: &str = "inboxd_guest";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    Duplicate,
    DeadLettered,
    /// Another consumer committed this partition past `expected` first: this
    /// record's work was rolled back, and the caller must re-read the position.
    Fenced,
}

/// Why and how an event is parked.
struct Park<'a> {
    kind: ReasonKind,
    reason: &'a str,
    attempts: u32,
    first_failed_at: i64,
}

/// The host's own failures. None of them is counted against the handler: the
/// caller retries the same record with backoff.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Database(#[from] DbError),
    #[error("the guest call ended without handing back its transaction; the record will be retried")]
    LostTransaction,
    #[error("shutting down: the record was abandoned before its commit and will be redelivered")]
    Abandoned,
}

pub struct Pipeline {
    db: Database,
    handler: Arc<HandlerComponent>,
    event_id: EventIdConfig,
    retry: RetryConfig,
    stats: Arc<Stats>,
}

impl Pipeline {
    pub fn new(
        db: Database,
        handler: Arc<HandlerComponent>,
        event_id: EventIdConfig,
        retry: RetryConfig,
        stats: Arc<Stats>,
    ) -> Self {
        Self {
            db,
            handler,
            event_id,
            retry,
            stats,
        }
    }

    pub fn db(&self) -> &Database {
        &self.db
    }

    pub fn handler_name(&self) -> &str {
        self.handler.name()
    }

    /// Processes one record to its end: applied, duplicate, or dead-lettered.
    /// `expected` is the partition's stored next offset as the caller last saw
    /// it (`None`: no row yet). Guest failures are retried here (the partition
    /// waits); on shutdown a pending retry is abandoned uncommitted.
    pub async fn process(
        &self,
        record: &Record,
        expected: Option<i64>,
        shutdown: &CancellationToken,
    ) -> Result<Outcome, PipelineError> {
        let event_id = match event_id::extract(&self.event_id, &record.headers, &record.payload) {
            Ok(id) => id,
            Err(error) => {
                return self.park_without_id(record, expected, &error.to_string()).await;
            }
        };
        let claim = Claim {
            handler: self.handler.name(),
            event_id: &event_id,
            topic: &record.topic,
            partition: record.partition,
            offset: record.offset,
            handler_version: self.handler.version(),
        };
        let mut first_failed_at = None;
        let mut attempt = 1;
        loop {
            let mut tx = self.db.begin().await?;
            if !inbox::claim(&mut tx, &claim).await? {
                if !self.finish(tx, record, expected).await? {
                    return Ok(Outcome::Fenced);
                }
                self.stats.duplicate();
                tracing::debug!(handler = claim.handler, event_id, "duplicate skipped");
                return Ok(Outcome::Duplicate);
            }
            let max_payload = self.handler.limits().max_payload_bytes;
            if record.payload.len() > max_payload {
                let reason = format!(
                    "limit limits.max_payload_bytes exceeded: the payload is {} bytes; the limit is {max_payload}",
                    record.payload.len()
                );
                let park = Park {
                    kind: ReasonKind::Limit,
                    reason: &reason,
                    attempts: 0,
                    first_failed_at: now_ms(),
                };
                return self.park_claimed(tx, &claim, record, expected, park).await;
            }
            tx.savepoint(GUEST_SAVEPOINT).await?;
            tx.enter_handler_scope(claim.handler, Scope::Guest).await?;
            let invocation = self.handler.invoke(tx, record, &event_id, attempt).await;
            let Some(mut tx) = invocation.tx else {
                return Err(PipelineError::LostTransaction);
            };
            let succeeded = invocation.result.is_ok() && invocation.host_error.is_none();
            let exited = tx.exit_handler_scope(GUEST_SAVEPOINT, succeeded).await;
            if let Some(error) = invocation.host_error {
                // Dropping the transaction rolls it back; the caller retries the record.
                return Err(error.into());
            }
            exited?;
            let failure = match invocation.result {
                Ok(()) => {
                    outbox::insert(&mut tx, claim.handler, &invocation.outbox).await?;
                    if let Some(violation) = invariants::violation(&mut tx, &claim, expected).await? {
                        // Nothing of this transaction may commit; park the event afresh.
                        tx.rollback().await?;
                        let reason = format!("sandbox violation: {violation}");
                        tracing::error!(handler = claim.handler, event_id, "{reason}");
                        let park = Park {
                            kind: ReasonKind::SandboxViolation,
                            reason: &reason,
                            attempts: attempt,
                            first_failed_at: now_ms(),
                        };
                        // mark_dead claims the event again as `dead` in the new transaction.
                        let tx = self.db.begin().await?;
                        return self.park_claimed(tx, &claim, record, expected, park).await;
                    }
                    if !self.finish(tx, record, expected).await? {
                        return Ok(Outcome::Fenced);
                    }
                    self.stats.applied();
                    return Ok(Outcome::Applied);
                }
                Err(failure) => failure,
            };
            // The guest's writes are undone; the claim stays for the dead letter.
            self.stats.guest_failure();
            let first = *first_failed_at.get_or_insert_with(now_ms);
            let final_kind = match failure {
                GuestFailure::Reject(_) => Some(ReasonKind::Rejected),
                _ if attempt >= self.retry.max_attempts => Some(ReasonKind::RetriesExhausted),
                _ => None,
            };
            let Some(kind) = final_kind else {
                tx.rollback().await?;
                let delay = backoff(&self.retry, attempt);
                tracing::warn!(
                    handler = claim.handler,
                    event_id,
                    attempt,
                    retry_in_ms = delay.as_millis() as u64,
                    "{failure}; retrying"
                );
                tokio::select! {
                    _ = shutdown.cancelled() => return Err(PipelineError::Abandoned),
                    _ = tokio::time::sleep(delay) => {}
                }
                attempt += 1;
                continue;
            };
            let reason = failure.to_string();
            let park = Park {
                kind,
                reason: &reason,
                attempts: attempt,
                first_failed_at: first,
            };
            return self.park_claimed(tx, &claim, record, expected, park).await;
        }
    }

    /// Parks a claimed event: the inbox row says `dead`, the dead letter says
    /// why, and the offset moves on, all in the claim's transaction.
    async fn park_claimed(
        &self,
        mut tx: Tx,
        claim: &Claim<'_>,
        record: &Record,
        expected: Option<i64>,
        park: Park<'_>,
    ) -> Result<Outcome, PipelineError> {
        inbox::mark_dead(&mut tx, claim).await?;
        let letter = DeadLetter {
            event_id: Some(claim.event_id),
            kind: park.kind,
            reason: park.reason,
            attempts: park.attempts,
            handler_version: Some(self.handler.version()),
            first_failed_at: park.first_failed_at,
            ..self.letter(record)
        };
        self.commit_dead_letter(tx, record, expected, &letter).await
    }

    /// A record without a usable event id can never be deduplicated, so it is
    /// never run: it is parked with the reason and the partition moves on.
    async fn park_without_id(
        &self,
        record: &Record,
        expected: Option<i64>,
        reason: &str,
    ) -> Result<Outcome, PipelineError> {
        let tx = self.db.begin().await?;
        let letter = DeadLetter {
            kind: ReasonKind::EventId,
            reason,
            attempts: 0,
            ..self.letter(record)
        };
        self.commit_dead_letter(tx, record, expected, &letter).await
    }

    /// Writes the dead letter, moves the offset on and commits: the end of
    /// every parked record.
    async fn commit_dead_letter(
        &self,
        mut tx: Tx,
        record: &Record,
        expected: Option<i64>,
        letter: &DeadLetter<'_>,
    ) -> Result<Outcome, PipelineError> {
        dead_letters::insert(&mut tx, letter).await?;
        if !self.finish(tx, record, expected).await? {
            return Ok(Outcome::Fenced);
        }
        self.stats.dead_lettered();
        tracing::warn!(
            handler = letter.handler,
            event_id = letter.event_id,
            topic = record.topic,
            partition = record.partition,
            offset = record.offset,
            kind = letter.kind.as_str(),
            attempts = letter.attempts,
            "dead-lettered: {}",
            letter.reason
        );
        Ok(Outcome::DeadLettered)
    }

    fn letter<'a>(&'a self, record: &'a Record) -> DeadLetter<'a> {
        DeadLetter {
            handler: self.handler.name(),
            event_id: None,
            topic: &record.topic,
            partition: record.partition,
            offset: record.offset,
            key: record.key.as_deref(),
            payload: &record.payload,
            headers: &record.headers,
            kind: ReasonKind::EventId,
            reason: "",
            attempts: 0,
            handler_version: None,
            first_failed_at: now_ms(),
        }
    }

    /// Every path ends here: the partition's next offset joins the same
    /// transaction as the effects, then everything commits together. `false`:
    /// fenced by another consumer, and everything was rolled back.
    async fn finish(&self, mut tx: Tx, record: &Record, expected: Option<i64>) -> Result<bool, DbError> {
        let advance = offsets::Advance {
            handler: self.handler.name(),
            topic: &record.topic,
            partition: record.partition,
            expected,
            next_offset: record.offset + 1,
            records: 1,
        };
        if !offsets::advance(&mut tx, &advance).await? {
            tx.rollback().await?;
            tracing::info!(
                handler = self.handler.name(),
                topic = record.topic,
                partition = record.partition,
                offset = record.offset,
                ?expected,
                "fenced: another consumer committed this partition first; this record's work was rolled back"
            );
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let retry = RetryConfig {
            max_attempts: 10,
            backoff_initial_ms: 100,
            backoff_max_ms: 1_000,
        };
        for _ in 0..50 {
            let first = backoff(&retry, 1).as_millis();
            assert!((50..=100).contains(&first), "{first}");
            let third = backoff(&retry, 3).as_millis();
            assert!((200..=400).contains(&third), "{third}");
            let late = backoff(&retry, 30).as_millis();
            assert!((500..=1_000).contains(&late), "{late}");
        }
    }
}
