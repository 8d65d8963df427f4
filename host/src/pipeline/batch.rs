//! Micro-batches: many records of one partition in one transaction.
//!
//! A commit is the expensive part of the inbox pattern (an fsync on
//! PostgreSQL), so consecutive records of a partition share one: each is
//! claimed and run in turn, and the partition's offset is written once, past
//! the last record, just before the single COMMIT. The host's invariant check
//! also runs once per batch and covers every event it applied.
//!
//! A batch is optimistic first: its handler calls share one savepoint, so
//! nothing is sent between two calls (a savepoint per call was a round trip
//! per event on PostgreSQL and a thread handoff on SQLite). Handlers rarely
//! fail, but when one does (or one of its statements does), undoing it
//! undoes the calls before it as well; the transaction is rolled back and the
//! batch runs again with a savepoint per call, where a failure undoes only
//! its own event and its neighbours commit. That second run decides, and
//! counts, every outcome, so a failing event costs at most one extra run of
//! the calls before it in its batch; and the handler's next few batches run
//! with a savepoint per call straight away, so a handler whose events keep
//! failing does not pay that extra run on every batch.

use super::guest::{Call, Called};
use super::keys::{BatchKeys, Turn};
use super::tail::Sealed;
use super::{Fence, Outcome, Park, Parked, Pipeline, PipelineError};
use crate::db::DbError;
use crate::db::now_ms;
use crate::db::outbox::{self, NewMessage};
use crate::db::{business_keys, dead_letters, inbox};
use crate::event_id;
use crate::handler::GuestFailure;
use crate::record::Record;
use crate::telemetry;
use std::collections::HashSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// How far a batch has committed. The caller keeps it across retries after
/// host errors, so records already committed are never run again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchCursor {
    /// Records of the batch committed so far.
    pub done: usize,
    /// What its transactions do with the partition's offset; with partition
    /// order, the stored next offset as they left it.
    pub fence: Fence,
    /// With key order: the keys of the records it parked (with an event id,
    /// so a replay can run them). Their later records are held behind them.
    pub parked_keys: Vec<Vec<u8>>,
}

impl BatchCursor {
    /// A cursor for partition order, from the stored next offset (`None`: no row yet).
    pub fn new(expected: Option<i64>) -> Self {
        Self {
            done: 0,
            fence: Fence::Partition(expected),
            parked_keys: Vec::new(),
        }
    }

    /// A cursor for key order (see [`Fence::Keyed`]).
    pub fn keyed() -> Self {
        Self {
            done: 0,
            fence: Fence::Keyed,
            parked_keys: Vec::new(),
        }
    }

    /// The partition's stored next offset after what committed (partition order).
    pub fn next_offset(&self) -> Option<i64> {
        match self.fence {
            Fence::Partition(expected) => expected,
            Fence::Keyed => None,
        }
    }

    fn committed(&mut self, records: &[Record]) {
        if let Some(last) = records.last() {
            self.done += records.len();
            if let Fence::Partition(_) = self.fence {
                self.fence = Fence::Partition(Some(last.offset + 1));
            }
        }
    }

    /// With key order, whether a record must wait behind one of its key
    /// that this batch parked.
    fn behind_parked(&self, record: &Record) -> bool {
        self.fence == Fence::Keyed
            && record
                .key
                .as_ref()
                .is_some_and(|key| self.parked_keys.contains(key))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEnd {
    /// Every record is committed: applied, skipped as a duplicate, or parked.
    Done,
    /// Another consumer moved the partition first; uncommitted work was rolled
    /// back and the caller must re-read the position.
    Fenced,
    /// Key order only: the records from `cursor.done` on were not run and go
    /// back to the partition task. `Some`: the first of them failed and is to
    /// be tried again alone, when it says; its key waits, the others go on.
    /// `None`: the first of them is of a key this batch parked.
    Returned(Option<Deferred>),
}

/// A record whose handler asked to be retried, with key order: its partition
/// does not wait for it, only its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deferred {
    /// The handler's next attempt.
    pub attempt: u32,
    pub first_failed_at: i64,
    /// When to run it again (the backoff after its first attempt).
    pub due: std::time::Instant,
}

/// A batch transaction takes no new record after running this long: it
/// commits what it did, and the rest go in the next transaction. On SQLite a
/// transaction holds the only writer, so a handler whose events each ran just
/// under their deadline held it for `max_events` deadlines while every other
/// handler waited (the sixth read of this round, issue 23); now the writer
/// changes hands at least this often plus one event's deadline. A healthy
/// batch of 500 events takes tens of milliseconds.
const BATCH_WALL: std::time::Duration = std::time::Duration::from_secs(1);

/// What one batch transaction came to.
enum TxEnd {
    /// The first `count` records committed. `retry`: the record after them
    /// failed in a way that is retried; it was not committed.
    Committed {
        count: usize,
        retry: Option<GuestFailure>,
        /// Key order: the records after `count` were not run because one
        /// of their key was parked in this transaction.
        cut: bool,
        /// Key order: the keys of the records parked (see [`BatchCursor::parked_keys`]).
        parked_keys: Vec<Vec<u8>>,
        /// It stopped taking records at [`BATCH_WALL`].
        walled: bool,
    },
    /// The invariant check failed: all `count` records were rolled back.
    Violation {
        count: usize,
        violation: String,
    },
    /// SQLite rolled the transaction back under the guest of the last of
    /// these `count` records (a write stopped at its deadline): nothing committed.
    Lost {
        count: usize,
    },
    /// A call failed in the optimistic run ([`Call::Redo`]): nothing
    /// committed; run the records again with a savepoint per call.
    Redo,
    Fenced,
    /// One of the host's own statements failed in a way retrying will not
    /// mend: nothing committed; run the records one at a time so it reaches
    /// its own event (see [`super::host_errors`]).
    HostError(PipelineError),
}

/// What happened to one record in the open transaction, reported after the commit.
enum Done {
    Applied(Option<i64>),
    Duplicate,
    /// Not run: another event with its business key was applied.
    DuplicateByKey,
    Parked(Parked),
}

/// The key a parked record blocks with key order: its Kafka key, if it has
/// an event id (a letter without one is never run again, so holding its
/// key's later records behind it would hold them for good).
fn blocks_key(record: &Record, event_id: Option<&str>) -> Option<Vec<u8>> {
    event_id.and(record.key.clone())
}

impl Pipeline {
    /// Processes `records` (consecutive records of one partition, in order;
    /// with key order, the records of some of its keys) from `cursor` on, in
    /// as few transactions as their outcomes allow.
    pub async fn process_batch(
        &self,
        records: &[Record],
        cursor: &mut BatchCursor,
        shutdown: &CancellationToken,
    ) -> Result<BatchEnd, PipelineError> {
        // Once a call failed, the rest of this batch runs a savepoint per call
        // (and so do the handler's next few batches: see `Slot::optimistic`).
        let mut optimistic = self.slot.optimistic();
        // How many records a transaction claims: after one stopped at
        // `BATCH_WALL`, as many as it got through, so a batch of slow events
        // does not claim (and give back) its whole remainder every time.
        let mut window = records.len();
        while cursor.done < records.len() {
            // A pump told to stop (pause, delete, a restart, shutdown) ends
            // after the transaction it is in; the records after it are not
            // committed, so their offsets are not stored, and whoever reads
            // the partition next runs them. Checked only in retry backoffs,
            // a stop waited for the whole batch: 1,000 events of a 30 s
            // deadline, one per transaction after `BATCH_WALL`, were hours
            // (the eleventh read).
            if shutdown.is_cancelled() {
                return Err(PipelineError::Abandoned);
            }
            let rest = &records[cursor.done..];
            // With key order, a record behind one this batch parked (in the
            // one-at-a-time runs below) is not run: the rest go back.
            if rest.iter().any(|record| cursor.behind_parked(record)) {
                return Ok(BatchEnd::Returned(None));
            }
            let span = self.batch_span(rest);
            let taken = &rest[..window.min(rest.len())];
            let end = self
                .batch_tx(taken, cursor.fence, optimistic && taken.len() > 1)
                .instrument(span.clone())
                .await;
            span.record("outcome", tx_outcome(&end));
            let end = match end {
                // A held-back INSERT of one of the calls failed when sent.
                Err(PipelineError::Database(DbError::DeferredFailed(reason))) => {
                    tracing::debug!(handler = self.handler.name(), reason, "held-back INSERTs failed");
                    TxEnd::Redo
                }
                // See `host_errors`: the failure is taken to its own event.
                Err(error) if !error.is_transient() => TxEnd::HostError(error),
                other => other?,
            };
            match end {
                TxEnd::Fenced => return Ok(BatchEnd::Fenced),
                TxEnd::Redo => {
                    tracing::debug!(
                        handler = self.handler.name(),
                        records = taken.len(),
                        "a call failed in an optimistic batch; running it again with a savepoint per call"
                    );
                    optimistic = false;
                    self.slot.be_careful();
                }
                TxEnd::Committed {
                    count,
                    retry,
                    cut,
                    parked_keys,
                    walled,
                } => {
                    if walled {
                        window = count.max(1);
                    }
                    cursor.committed(&rest[..count]);
                    cursor.parked_keys.extend(parked_keys);
                    if cut {
                        return Ok(BatchEnd::Returned(None));
                    }
                    if let Some(failure) = retry {
                        let record = &rest[count];
                        let first_failed_at = now_ms();
                        let event_id = event_id::of(&self.event_id, record).unwrap_or_default();
                        if cursor.fence == Fence::Keyed {
                            // Only its key waits: the partition task runs it
                            // again when its backoff is over.
                            let delay = self.log_retry(&event_id, 1, &failure);
                            return Ok(BatchEnd::Returned(Some(Deferred {
                                attempt: 2,
                                first_failed_at,
                                due: std::time::Instant::now() + delay,
                            })));
                        }
                        // The partition waits while this one event retries on its own.
                        self.wait_to_retry(&event_id, 1, &failure, shutdown).await?;
                        let outcome = self
                            .process_alone(record, cursor.fence, shutdown, 2, Some(first_failed_at))
                            .await?;
                        if outcome == Outcome::Fenced {
                            return Ok(BatchEnd::Fenced);
                        }
                        cursor.committed(std::slice::from_ref(record));
                    }
                }
                TxEnd::Violation { .. } | TxEnd::Lost { .. } | TxEnd::HostError(_) => {
                    // One of these events broke the walls, its guest's
                    // statement took the transaction with it, or the database
                    // refused the host's own statements for it; run them one
                    // at a time so only that one fails (its attempts counted).
                    let count = match end {
                        TxEnd::Violation { count, violation } => {
                            tracing::error!(
                                handler = self.handler.name(),
                                records = count,
                                "sandbox violation in a batch ({violation}); running its records one at a time"
                            );
                            count
                        }
                        TxEnd::Lost { count } => {
                            tracing::warn!(
                                handler = self.handler.name(),
                                records = count,
                                "a handler's statement was stopped at its deadline and SQLite rolled the batch \
                                 back; running its records one at a time"
                            );
                            count
                        }
                        TxEnd::HostError(error) => {
                            tracing::warn!(
                                handler = self.handler.name(),
                                records = taken.len(),
                                "the database refused a batch's transaction ({error}); running its records \
                                 one at a time"
                            );
                            taken.len()
                        }
                        _ => unreachable!("matched above"),
                    };
                    for record in &rest[..count] {
                        // Each alone is a transaction of its own: a stop
                        // ends the run between them, as between batches
                        // (a batch SQLite rolled back ran its 1,000 records
                        // alone, each up to its deadline: the twelfth read).
                        if shutdown.is_cancelled() {
                            return Err(PipelineError::Abandoned);
                        }
                        if cursor.behind_parked(record) {
                            return Ok(BatchEnd::Returned(None));
                        }
                        // Run alone, a record does not pass through the batch's
                        // check of keys another consumer parked: look first.
                        if let Some(key) = self.blocked_elsewhere(record, cursor.fence).await? {
                            cursor.parked_keys.push(key);
                            return Ok(BatchEnd::Returned(None));
                        }
                        let outcome = self
                            .process_alone(record, cursor.fence, shutdown, 1, None)
                            .await?;
                        match outcome {
                            Outcome::Fenced => return Ok(BatchEnd::Fenced),
                            Outcome::DeadLettered if cursor.fence == Fence::Keyed => {
                                let id = event_id::of(&self.event_id, record).ok();
                                cursor.parked_keys.extend(blocks_key(record, id.as_deref()));
                            }
                            _ => {}
                        }
                        cursor.committed(std::slice::from_ref(record));
                    }
                }
            }
        }
        Ok(BatchEnd::Done)
    }

    /// With key order, `record`'s key if a parked letter blocks it now
    /// (another consumer's, in a rebalance): read on its own, for a record
    /// about to run alone.
    async fn blocked_elsewhere(
        &self,
        record: &Record,
        fence: Fence,
    ) -> Result<Option<Vec<u8>>, PipelineError> {
        let (Fence::Keyed, Some(key)) = (fence, &record.key) else {
            return Ok(None);
        };
        let at = dead_letters::KeyAt {
            handler: self.handler.name(),
            topic: &record.topic,
            partition: record.partition,
            key,
        };
        let mut tx = self.db.begin().await?;
        let first = dead_letters::first_blocking(&mut tx, &at, false).await?;
        tx.rollback().await?;
        Ok(first
            .filter(|(_, offset)| *offset < record.offset)
            .map(|_| key.clone()))
    }

    /// With key order, the key a parked `record` blocks, if any (see [`blocks_key`]).
    pub fn parked_blocks(&self, record: &Record) -> Option<Vec<u8>> {
        let id = event_id::of(&self.event_id, record).ok();
        blocks_key(record, id.as_deref())
    }

    /// One transaction over `records`, stopping early only at a record whose
    /// handler failure is to be retried. `optimistic`: the calls share one
    /// savepoint, and any failed call ends it with [`TxEnd::Redo`].
    async fn batch_tx(
        &self,
        records: &[Record],
        fence: Fence,
        optimistic: bool,
    ) -> Result<TxEnd, PipelineError> {
        let mut tx = self.db.begin_guest(self.handler.name()).await?;
        let started = std::time::Instant::now();
        tx.share_guest_savepoint(optimistic);
        // Every event id first, then all new ones claimed in one go (a
        // statement per event would be a round trip per event).
        // An id may be read from a payload's JSON, and a batch holds up to
        // 32 MiB of payloads: the runtime's other tasks get a turn after
        // each MiB read (the forty-ninth read).
        let mut ids: Vec<Result<String, String>> = Vec::with_capacity(records.len());
        let mut read = 0usize;
        for record in records {
            ids.push(event_id::of(&self.event_id, record).map_err(|e| e.to_string()));
            read += record.payload.len();
            if read >= 1 << 20 {
                read = 0;
                tokio::task::yield_now().await;
            }
        }
        let mut seen = HashSet::new();
        let claims: Vec<_> = records
            .iter()
            .zip(&ids)
            .filter_map(|(record, id)| {
                let id = id.as_deref().ok().filter(|id| seen.insert(*id))?;
                Some(self.claim(record, id))
            })
            .collect();
        let mut fresh = inbox::claim_many(&mut tx, &claims).await?;
        // Their business keys, if the handler dedups by one: all at once.
        let mut first = HashSet::new();
        let new_events: Vec<(&Record, &str)> = records
            .iter()
            .zip(&ids)
            .filter_map(|(record, id)| {
                let id = id.as_deref().ok()?;
                (fresh.contains(id) && first.insert(id)).then_some((record, id))
            })
            .collect();
        let mut keys = BatchKeys::claim(self, &mut tx, &new_events).await?;
        // With key order, the new events' keys a parked letter blocks now: the
        // partition task knew of those it parked, but another consumer may
        // have parked one in a rebalance (read after the claims, which
        // waited for that consumer's transaction).
        let blocked = match fence {
            Fence::Keyed => {
                let keys: Vec<&[u8]> = new_events.iter().filter_map(|(r, _)| r.key.as_deref()).collect();
                let first = &records[0];
                dead_letters::blocked_among(
                    &mut tx,
                    self.handler.name(),
                    &first.topic,
                    first.partition,
                    &keys,
                )
                .await?
            }
            Fence::Partition(_) => HashSet::new(),
        };
        let mut found_blocked = None;
        let mut done = Vec::with_capacity(records.len());
        let mut applied = Vec::new();
        let mut messages = Vec::new();
        let mut held_bytes = 0;
        let mut retry = None;
        let mut cut = false;
        let mut walled = false;
        for (index, (record, id)) in records.iter().zip(&ids).enumerate() {
            if index > 0 && started.elapsed() >= BATCH_WALL {
                // The records from here on go in the next transaction.
                let unrun = fresh.drain().collect();
                self.unclaim(&mut tx, &keys, unrun).await?;
                walled = true;
                break;
            }
            let event_id = match id {
                Ok(id) => id,
                Err(reason) => {
                    let parked = self.park_without_id(&mut tx, record, reason).await?;
                    done.push(Done::Parked(parked));
                    continue;
                }
            };
            // Taken out, so a later copy in this batch counts as the duplicate it is.
            if !fresh.remove(event_id) {
                tracing::debug!(handler = self.handler.name(), event_id, "duplicate skipped");
                done.push(Done::Duplicate);
                continue;
            }
            if let Some(key) = record.key.as_ref().filter(|key| blocked.contains(*key)) {
                // It and the rest go back to the partition task, which holds it.
                let unrun = std::iter::once(event_id.clone()).chain(fresh.drain()).collect();
                self.unclaim(&mut tx, &keys, unrun).await?;
                found_blocked = Some(key.clone());
                cut = true;
                break;
            }
            let holding = match keys.turn(self, &mut tx, record, event_id).await? {
                Turn::DuplicateByKey => {
                    tracing::debug!(
                        handler = self.handler.name(),
                        event_id,
                        "duplicate by key skipped"
                    );
                    done.push(Done::DuplicateByKey);
                    continue;
                }
                Turn::Run => None,
                Turn::RunHolding(key) => Some(key),
            };
            let claim = self.claim(record, event_id);
            let Called {
                tx: returned,
                call,
                lost,
                ..
            } = self.run_claimed(tx, &claim, record, 1).await?;
            tx = returned;
            if lost {
                tx.rollback().await?;
                return Ok(TxEnd::Lost {
                    count: done.len() + 1,
                });
            }
            let park = match call {
                Call::DuplicateByKey => unreachable!("a batch claims keys before its calls"),
                Call::Applied(published) => {
                    done.push(Done::Applied(record.timestamp_ms));
                    applied.push(event_id.clone());
                    held_bytes += published.iter().map(NewMessage::bytes).sum::<usize>();
                    messages.extend(published);
                    if held_bytes >= outbox::BATCH_HELD_BYTES {
                        // Written now rather than at the seal: they commit or
                        // roll back with the transaction all the same, and
                        // the host holds one statement's worth, not a batch's.
                        outbox::insert(&mut tx, self.handler.name(), &messages).await?;
                        tracing::debug!(
                            handler = self.handler.name(),
                            messages = messages.len(),
                            bytes = held_bytes,
                            "outbox messages written before the batch's end"
                        );
                        messages.clear();
                        held_bytes = 0;
                    }
                    continue;
                }
                Call::TooLarge(reason) => Park::too_large(reason, record),
                Call::Redo => {
                    tx.rollback().await?;
                    return Ok(TxEnd::Redo);
                }
                Call::Failed(failure) => match self.final_kind(&failure, 1) {
                    Some(kind) => Park {
                        kind,
                        reason: failure.to_string(),
                        attempts: 1,
                        first_failed_at: now_ms(),
                    },
                    None => {
                        // Its claim and those of the records after it go back,
                        // with the business keys they hold: the event runs
                        // again after a backoff, and nothing after it may
                        // commit first.
                        let unrun = std::iter::once(event_id.clone()).chain(fresh.drain()).collect();
                        self.unclaim(&mut tx, &keys, unrun).await?;
                        retry = Some(failure);
                        break;
                    }
                },
            };
            let parked = self.park_claimed(&mut tx, &claim, record, park).await?;
            keys.freed_by(holding);
            done.push(Done::Parked(parked));
            // With key order, a later record of a parked key waits behind it:
            // the batch ends here and gives the rest back to its task.
            if fence == Fence::Keyed
                && record.key.is_some()
                && records[index + 1..].iter().any(|later| later.key == record.key)
            {
                let unrun = fresh.drain().collect();
                self.unclaim(&mut tx, &keys, unrun).await?;
                cut = true;
                break;
            }
        }
        let count = done.len();
        let Some(last) = count.checked_sub(1).map(|i| &records[i]) else {
            tx.rollback().await?;
            return Ok(TxEnd::Committed {
                count,
                retry,
                cut,
                parked_keys: found_blocked.into_iter().collect(),
                walled,
            });
        };
        match self.seal(tx, last, fence, count, &applied, &messages).await? {
            Sealed::Committed => {}
            Sealed::Raced => return Ok(TxEnd::Fenced),
            Sealed::Violation(violation) => return Ok(TxEnd::Violation { count, violation }),
        }
        let parked_keys = match fence {
            Fence::Keyed => done
                .iter()
                .zip(records)
                .filter_map(|(outcome, record)| match outcome {
                    Done::Parked(parked) => blocks_key(record, parked.event_id.as_deref()),
                    _ => None,
                })
                .chain(found_blocked)
                .collect(),
            Fence::Partition(_) => Vec::new(),
        };
        self.report(done);
        Ok(TxEnd::Committed {
            count,
            retry,
            cut,
            parked_keys,
            walled,
        })
    }

    /// Gives back the claims of events that were not run, with the business
    /// keys they hold, in the open transaction.
    async fn unclaim(
        &self,
        tx: &mut crate::db::Tx,
        keys: &BatchKeys,
        unrun: Vec<String>,
    ) -> Result<(), PipelineError> {
        for (key, id) in keys.held_by(&unrun) {
            business_keys::release(tx, self.handler.name(), key, id).await?;
        }
        for id in unrun {
            inbox::unclaim(tx, self.handler.name(), &id).await?;
        }
        Ok(())
    }

    /// The span of one batch transaction, exported over OTLP (see `telemetry`).
    fn batch_span(&self, records: &[Record]) -> tracing::Span {
        if !telemetry::tracing_on() {
            return tracing::Span::none();
        }
        tracing::info_span!(
            target: telemetry::TRACE_TARGET,
            "inboxd.batch",
            handler = self.handler.name(),
            topic = records[0].topic,
            partition = records[0].partition,
            first_offset = records[0].offset,
            size = records.len(),
            outcome = tracing::field::Empty,
        )
    }

    /// Counts and logs a committed batch's outcomes.
    fn report(&self, done: Vec<Done>) {
        let (mut duplicates, mut by_key) = (0, 0);
        let mut applied = Vec::with_capacity(done.len());
        for outcome in done {
            match outcome {
                Done::Applied(timestamp) => applied.push(timestamp),
                Done::Duplicate => duplicates += 1,
                Done::DuplicateByKey => by_key += 1,
                Done::Parked(parked) => parked.report(self.handler.name(), &self.stats),
            }
        }
        self.stats.applied(applied);
        self.stats.duplicates(duplicates);
        if by_key > 0 {
            self.stats.duplicates_by_key(by_key);
        }
    }
}

/// A batch transaction's end, in a word (its span's `outcome`).
fn tx_outcome(end: &Result<TxEnd, PipelineError>) -> &'static str {
    match end {
        Ok(TxEnd::Committed { retry: Some(_), .. }) => "committed-then-retry",
        Ok(TxEnd::Committed { cut: true, .. }) => "committed-then-held",
        Ok(TxEnd::Committed { .. }) => "committed",
        Ok(TxEnd::Fenced) => "fenced",
        Ok(TxEnd::Redo) => "redo",
        Ok(TxEnd::Violation { .. }) => "sandbox-violation",
        Ok(TxEnd::Lost { .. }) => "lost",
        Ok(TxEnd::HostError(_)) | Err(_) => "error",
    }
}
