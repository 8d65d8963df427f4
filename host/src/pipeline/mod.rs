//! The inbox transaction: claim -> invoke -> offset -> commit.
//!
//! This is where the promise of design §1 is kept. For each record, in the
//! same transaction as its neighbours in a micro-batch ([`batch`]): claim
//! `(handler, event id)` in the inbox (a duplicate stops here), run the
//! handler on the same transaction inside a savepoint, and finally write the
//! partition's next offset and commit. A record that cannot succeed is parked
//! in `dead_letters` the same way, so every record ends applied once or
//! parked with its reason. Only after the commit does the caller tell Kafka
//! anything.
//!
//! A handler that asks to retry stops its batch: the records before it
//! commit, and it runs again alone (`Pipeline::process_from`) with backoff while
//! its partition waits, so order within the partition is kept.

mod batch;
pub mod guest;
mod held;
mod host_errors;
mod keys;
mod spent;
pub mod tail;

pub use batch::{BatchCursor, BatchEnd, Deferred};
pub use held::Held;
pub use host_errors::HOST_ERROR_ATTEMPTS;

use crate::config::{DedupConfig, EventIdConfig, RetryConfig};
use crate::db::business_keys;
use crate::db::dead_letters::{self, DeadLetter, ReasonKind};
use crate::db::inbox::{self, Claim};
use crate::db::outbox::NewMessage;
use crate::db::{Database, DbError, Tx, now_ms, offsets};
use crate::handler::GuestFailure;
use crate::handler::Handler;
use crate::record::Record;
use crate::stats::Stats;
use crate::telemetry;
use crate::{business_key, event_id};
use guest::{Call, Called};
use rand::Rng;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tail::{End, Sealed};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    Duplicate,
    DeadLettered,
    /// Another consumer committed this partition past `expected` first: this
    /// record's work was rolled back, and the caller must re-read the position.
    Fenced,
}

/// What a transaction does with its partition's stored offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Partition order: it moves the offset past its records, from
    /// `expected` (`None`: no row yet), and is rolled back if another
    /// consumer moved it first.
    Partition(Option<i64>),
    /// Key order (`ordering = "key"`): batches of one partition commit out
    /// of offset order, so none moves the offset. The partition task raises
    /// it to the lowest offset not yet settled (`kafka::keyed`); a record
    /// above it that committed is a duplicate when it comes again.
    Keyed,
}

/// Why and how an event is parked.
struct Park {
    kind: ReasonKind,
    reason: String,
    attempts: u32,
    first_failed_at: i64,
}

/// The host's own failures. None of them is counted against the handler: the
/// caller retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Database(#[from] DbError),
    #[error("the guest call ended without handing back its transaction; the record will be retried")]
    LostTransaction,
    #[error("shutting down: the record was abandoned before its commit and will be redelivered")]
    Abandoned,
}

/// What running one event inside an open transaction came to.
enum Step {
    /// The inbox already had its event id.
    Duplicate,
    /// It was claimed and the handler called (or refused, see [`Call`]).
    Ran(Call),
}

impl Park {
    /// An event whose payload is past its handler's limit: parked unrun.
    /// A record past its handler's payload limit: `cut` if the host could
    /// not keep it whole (then its letter can never be replayed).
    fn too_large(reason: String, record: &Record) -> Self {
        Park {
            kind: if record.cut.is_some() {
                ReasonKind::Cut
            } else {
                ReasonKind::Limit
            },
            reason,
            attempts: 0,
            first_failed_at: now_ms(),
        }
    }
}

/// What a handler's pipeline runs: its code and the settings of that version.
#[derive(Clone)]
pub struct Loaded {
    pub handler: Arc<dyn Handler>,
    pub event_id: EventIdConfig,
    pub retry: RetryConfig,
    /// Business-key dedup (`[handlers.dedup]`), if configured.
    pub dedup: Option<DedupConfig>,
}

// What is kept of a record whole is what a team may raise its limit to
// (`record` is below `config`'s reach, so the two are checked here).
const _: () =
    assert!(crate::record::KEPT_AT_LEAST as u64 == crate::config::defaults::TEAM_CEILING_MAX_PAYLOAD_BYTES);

/// The version a handler's next batch will run. Swapping it is how a new
/// version goes live without a restart: a batch pins the version it started
/// with ([`Pipeline::pinned`]) and finishes on it, retries included.
#[derive(Clone)]
pub struct Slot {
    loaded: Arc<std::sync::RwLock<Loaded>>,
    /// Batches of this handler still to run with a savepoint per call (see
    /// [`Slot::optimistic`]).
    careful: Arc<AtomicU32>,
    /// What each event's attempt already ran, over runs given up.
    spent: Arc<std::sync::Mutex<spent::Spent>>,
}

/// After a call fails in an optimistic batch, this many of the handler's
/// next batches skip the optimistic run. A handler whose events keep failing
/// (or that keeps catching failed statements on PostgreSQL) would otherwise
/// pay an extra run of its batch every time; one that fails rarely loses
/// the shared savepoint for only a few batches.
const CAREFUL_BATCHES: u32 = 16;

impl Slot {
    pub fn new(loaded: Loaded) -> Self {
        Self {
            loaded: Arc::new(std::sync::RwLock::new(loaded)),
            careful: Arc::default(),
            spent: Arc::default(),
        }
    }

    pub fn current(&self) -> Loaded {
        self.loaded.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn swap(&self, loaded: Loaded) {
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = loaded;
        self.careful.store(0, Ordering::Relaxed);
    }

    /// `limits.max_payload_bytes` of the version a new batch runs: what
    /// the consumer keeps of a record (see [`crate::record::Cut`]).
    pub fn max_payload_bytes(&self) -> usize {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .handler
            .max_payload_bytes()
    }

    /// Whether the next batch may run optimistically (one savepoint for all
    /// its calls); counts down the careful batches.
    fn optimistic(&self) -> bool {
        self.careful
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_err()
    }

    /// A call failed in an optimistic batch.
    fn be_careful(&self) {
        self.careful.store(CAREFUL_BATCHES, Ordering::Relaxed);
    }
}

#[derive(Clone)]
pub struct Pipeline {
    db: Database,
    handler: Arc<dyn Handler>,
    event_id: EventIdConfig,
    retry: RetryConfig,
    dedup: Option<DedupConfig>,
    stats: Arc<Stats>,
    slot: Slot,
}

impl Pipeline {
    pub fn new(db: Database, slot: Slot, stats: Arc<Stats>) -> Self {
        let Loaded {
            handler,
            event_id,
            retry,
            dedup,
        } = slot.current();
        Self {
            db,
            handler,
            event_id,
            retry,
            dedup,
            stats,
            slot,
        }
    }

    /// This pipeline on the slot's current version: what a new batch runs.
    pub fn pinned(&self) -> Self {
        Self::new(self.db.clone(), self.slot.clone(), self.stats.clone())
    }

    /// What the consumer keeps of a record for this handler (see
    /// [`crate::record::Cut`]): from its current version's `limits.max_payload_bytes`.
    pub fn kept_bytes(&self) -> usize {
        crate::record::Cut::kept_for(self.slot.max_payload_bytes())
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn db(&self) -> &Database {
        &self.db
    }

    pub fn handler_name(&self) -> &str {
        self.handler.name()
    }

    /// As [`Pipeline::process`], starting at `attempt` (a batch already ran
    /// the earlier ones).
    async fn process_from(
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

    /// Runs the handler for an event claimed in `tx` ([`guest::call`]) and counts it.
    async fn run_claimed(
        &self,
        tx: Tx,
        claim: &Claim<'_>,
        record: &Record,
        attempt: u32,
    ) -> Result<Called, PipelineError> {
        let span = self.event_span(record, claim.event_id, attempt);
        let spent = || self.slot.spent.lock().unwrap_or_else(|p| p.into_inner());
        let before = spent().before(claim.event_id, attempt);
        let started = std::time::Instant::now();
        let called = guest::call(&*self.handler, tx, record, claim.event_id, attempt, before)
            .instrument(span.clone())
            .await;
        // Whatever became of the run (a host error included): if it is run
        // again, it is this attempt's time that was used.
        spent().add(claim.event_id, attempt, started.elapsed());
        let called = called?;
        span.record("outcome", called.call.outcome());
        span.record("guest_us", called.took.as_micros() as u64);
        match &called.call {
            Call::Applied(_) => self.stats.guest_took(called.took),
            Call::Failed(failure) => {
                self.stats.guest_took(called.took);
                self.stats.guest_failure(failure.kind());
            }
            // Counted when the batch runs it again, or by the caller.
            Call::TooLarge(_) | Call::Redo | Call::DuplicateByKey => {}
        }
        Ok(called)
    }

    /// The record's business key and the dedup settings, if the handler
    /// dedups by one and the record carries it.
    fn business_key(&self, record: &Record) -> Option<(String, &DedupConfig)> {
        let dedup = self.dedup.as_ref()?;
        Some((business_key::of(dedup, record)?, dedup))
    }

    /// Frees the business key an event claimed before its handler ran: it was
    /// parked, or goes back to be retried, so it holds nothing.
    async fn release_business_key(
        &self,
        tx: &mut Tx,
        record: &Record,
        event_id: &str,
    ) -> Result<(), DbError> {
        match self.business_key(record) {
            Some((key, _)) => business_keys::release(tx, self.handler.name(), &key, event_id).await,
            None => Ok(()),
        }
    }

    /// The span of one guest call, exported over OTLP (see `telemetry`):
    /// a child of the event's `traceparent`, else of the batch's span.
    fn event_span(&self, record: &Record, event_id: &str, attempt: u32) -> tracing::Span {
        if !telemetry::tracing_on() {
            return tracing::Span::none();
        }
        let span = tracing::info_span!(
            target: telemetry::TRACE_TARGET,
            "inboxd.event",
            handler = self.handler.name(),
            version = self.handler.version_label(),
            event_id,
            attempt,
            topic = record.topic,
            partition = record.partition,
            offset = record.offset,
            outcome = tracing::field::Empty,
            guest_us = tracing::field::Empty,
            sql_statements = tracing::field::Empty,
        );
        telemetry::with_parent_of(span, &record.headers)
    }

    /// `Some`: the failure is final and the event is parked with this kind.
    fn final_kind(&self, failure: &GuestFailure, attempt: u32) -> Option<ReasonKind> {
        match failure {
            GuestFailure::Reject(_) => Some(ReasonKind::Rejected),
            _ if attempt >= self.retry.max_attempts => Some(ReasonKind::RetriesExhausted),
            _ => None,
        }
    }

    /// Logs the failure and waits out its backoff, unless shutdown comes first.
    async fn wait_to_retry(
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
    fn log_retry(&self, event_id: &str, attempt: u32, failure: &GuestFailure) -> Duration {
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

    fn claim<'a>(&'a self, record: &'a Record, event_id: &'a str) -> Claim<'a> {
        Claim {
            handler: self.handler.name(),
            event_id,
            topic: &record.topic,
            partition: record.partition,
            offset: record.offset,
            handler_version: self.handler.version_label(),
        }
    }

    /// Parks a claimed event in `tx`: the inbox row says `dead` (so a replayed
    /// copy is not run again by accident) and the dead letter says why.
    async fn park_claimed(
        &self,
        tx: &mut Tx,
        claim: &Claim<'_>,
        record: &Record,
        park: Park,
    ) -> Result<Parked, PipelineError> {
        inbox::mark_dead(tx, claim).await?;
        // A parked event holds no business key: a later event with its key
        // is applied, and a replay of this one claims the key afresh.
        self.release_business_key(tx, record, claim.event_id).await?;
        let letter = DeadLetter {
            event_id: Some(claim.event_id),
            kind: park.kind,
            reason: &park.reason,
            attempts: park.attempts,
            handler_version: Some(self.handler.version_label()),
            first_failed_at: park.first_failed_at,
            ..self.letter(record)
        };
        dead_letters::insert(tx, &letter).await?;
        Ok(Parked::new(&letter))
    }

    /// Parks an event in a transaction of its own, after the one that
    /// claimed it was rolled back: it claims the event again first, and if
    /// another copy of it (another partition's, say) applied or parked it
    /// meanwhile, this one is the duplicate it now is and nothing is parked.
    /// (Marking it `dead` over the other's `done` would let a replay apply it
    /// twice.)
    async fn park_alone(
        &self,
        claim: &Claim<'_>,
        record: &Record,
        fence: Fence,
        park: Park,
    ) -> Result<Outcome, PipelineError> {
        let mut tx = self.db.begin_guest(self.handler.name()).await?;
        if !inbox::claim(&mut tx, claim).await? {
            if !self.finish(tx, record, fence, 1).await? {
                return Ok(Outcome::Fenced);
            }
            self.stats.duplicates(1);
            tracing::info!(
                handler = claim.handler,
                event_id = claim.event_id,
                "another copy of the event was applied or parked while this one failed: skipped as a duplicate"
            );
            return Ok(Outcome::Duplicate);
        }
        let letter = self.park_claimed(&mut tx, claim, record, park).await?;
        self.commit_parked(tx, record, fence, letter).await
    }

    /// A record without a usable event id can never be deduplicated, so it is
    /// never run: it is parked in `tx` with the reason and the partition moves on.
    async fn park_without_id(
        &self,
        tx: &mut Tx,
        record: &Record,
        reason: &str,
    ) -> Result<Parked, PipelineError> {
        let letter = DeadLetter {
            kind: ReasonKind::EventId,
            reason,
            attempts: 0,
            ..self.letter(record)
        };
        dead_letters::insert(tx, &letter).await?;
        Ok(Parked::new(&letter))
    }

    /// Moves the offset past a record parked alone in `tx` and commits.
    async fn commit_parked(
        &self,
        tx: Tx,
        record: &Record,
        fence: Fence,
        parked: Parked,
    ) -> Result<Outcome, PipelineError> {
        if !self.finish(tx, record, fence, 1).await? {
            return Ok(Outcome::Fenced);
        }
        parked.report(self.handler.name(), &self.stats);
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
            record_bytes: record.cut.map(|cut| cut.record_bytes()),
        }
    }

    /// Every path ends here ([`tail::seal`]): the outbox messages of the
    /// `applied` events, the host's check of its rows, and (with partition
    /// order) the partition's next offset past `last` join the same
    /// transaction as the effects of its `records` records, then everything
    /// commits together.
    async fn seal(
        &self,
        tx: Tx,
        last: &Record,
        fence: Fence,
        records: usize,
        applied: &[String],
        messages: &[NewMessage],
    ) -> Result<Sealed, DbError> {
        let end = match fence {
            Fence::Partition(expected) => End::Advance(offsets::Advance {
                handler: self.handler.name(),
                topic: &last.topic,
                partition: last.partition,
                expected,
                next_offset: last.offset + 1,
                records: records as i64,
            }),
            Fence::Keyed => End::Claims,
        };
        let sealed = tail::seal(tx, self.handler.name(), applied, messages, end).await?;
        if sealed == Sealed::Raced {
            tracing::info!(
                handler = self.handler.name(),
                topic = last.topic,
                partition = last.partition,
                offset = last.offset,
                records,
                ?fence,
                "fenced: another consumer committed this partition first; this work was rolled back"
            );
        }
        Ok(sealed)
    }

    /// [`Pipeline::seal`] for a transaction that applied nothing (duplicates
    /// and parks only). `false`: fenced by another consumer, and everything
    /// was rolled back.
    async fn finish(&self, tx: Tx, last: &Record, fence: Fence, records: usize) -> Result<bool, DbError> {
        match self.seal(tx, last, fence, records, &[], &[]).await? {
            Sealed::Committed => Ok(true),
            Sealed::Raced => Ok(false),
            Sealed::Violation(_) => unreachable!("with nothing applied, nothing is checked"),
        }
    }
}

/// A dead letter written in a transaction, reported once that commits.
struct Parked {
    event_id: Option<String>,
    topic: String,
    partition: i32,
    offset: i64,
    kind: ReasonKind,
    attempts: u32,
    reason: String,
}

impl Parked {
    fn new(letter: &DeadLetter<'_>) -> Self {
        Self {
            event_id: letter.event_id.map(str::to_owned),
            topic: letter.topic.to_owned(),
            partition: letter.partition,
            offset: letter.offset,
            kind: letter.kind,
            attempts: letter.attempts,
            reason: letter.reason.to_owned(),
        }
    }

    fn report(&self, handler: &str, stats: &Stats) {
        stats.dead_lettered();
        tracing::warn!(
            handler,
            event_id = self.event_id,
            topic = self.topic,
            partition = self.partition,
            offset = self.offset,
            kind = self.kind.as_str(),
            attempts = self.attempts,
            "dead-lettered: {}",
            self.reason
        );
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
mod tests;
