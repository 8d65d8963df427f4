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

mod alone;
mod batch;
pub mod guest;
mod held;
mod host_errors;
mod keys;
mod park;
mod spent;
pub mod tail;

pub use alone::backoff;
pub use batch::{BatchCursor, BatchEnd, Deferred};
pub use held::Held;
pub use host_errors::HOST_ERROR_ATTEMPTS;
use park::{Park, Parked};

use crate::business_key;
use crate::config::{DedupConfig, EventIdConfig, RetryConfig};
use crate::db::business_keys;
use crate::db::inbox::Claim;
use crate::db::outbox::NewMessage;
use crate::db::{Database, DbError, Tx, offsets};
use crate::handler::Handler;
use crate::record::Record;
use crate::stats::Stats;
use crate::telemetry;
use guest::{Call, Called};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use tail::{End, Sealed};
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

#[cfg(test)]
mod tests;
