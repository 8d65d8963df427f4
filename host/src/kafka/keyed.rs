//! One assigned partition's loop with `ordering = "key"`: each Kafka key's
//! records in offset order, different keys in parallel, and a failing key
//! waiting alone.
//!
//! Records are buffered as with partition order ([`super::partition`]), and
//! up to [`LANES`] batches of one partition run at once, each over records
//! of keys no other work of the partition holds (a key is *busy* from the
//! launch of its records until their batch ends). A record whose handler
//! asks for a retry does not hold its batch: the batch commits what came
//! before it and gives the rest back ([`BatchEnd::Returned`]), and the
//! record runs again alone after its backoff, while only its key waits.
//! When a record is parked, its key is *blocked*: the key's later records
//! are never run but parked as `held` behind it ([`Pipeline::hold`]) until
//! an operator replays or discards that dead letter.
//!
//! Batches commit out of offset order, so none of them moves the stored
//! offset (see [`Fence::Keyed`]). The task raises it, in a transaction of its
//! own after each batch, to the lowest offset not yet settled: every record
//! below is committed or parked. After a crash or a rebalance, records above
//! it that committed come again and are skipped by the inbox.
//! Records without a key are one key among the others, so they keep
//! partition order among themselves.

use super::blocked_keys::{BlockedKeys, MAX_BLOCKED_KEYS, RELOAD};
use super::key_jobs::{hold_or_park, retry_alone};
use super::partition::{
    Admit, BatchDone, BatchTask, MAX_BUFFERED_BYTES, Position, Stops, sleep_until, to_record,
};
use crate::db::dead_letters::{self, KeyDigest, key_digest};
use crate::db::offsets;
use crate::pipeline::{BatchCursor, BatchEnd, Deferred, Held, Outcome, PipelineError};
use crate::record::Record;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Bytes ([`Record::bytes`]) a partition may hold unsettled before its queue
/// is left unread: its buffer and what its lanes, holds and retries hold.
/// (Bounding the buffer alone let records waiting out a retry's backoff,
/// one per key, reach 24 GB for a partition of 1 MB records.)
const MAX_UNSETTLED_BYTES: usize = 2 * MAX_BUFFERED_BYTES;

/// Batches of one partition in flight at once, at most: each holds a
/// database connection for its transaction, so this times the assigned
/// partitions is what a handler may ask of the pool.
pub const LANES: usize = 8;

/// How often a handler at its `max_held_records` looks whether it has room again.
const FULL_PROBE: Duration = Duration::from_secs(5);

/// A record's Kafka key by its SHA-256, taken once when the record is read;
/// records without one share `None`. (Each look for work to start walks the
/// buffer: hashing whole keys there, at every record read, cost as much as
/// the buffer's keys, up to megabytes each: the seventeenth read.)
type Key = Option<KeyDigest>;

fn key_of(record: &Record) -> Key {
    record.key.as_deref().map(key_digest)
}

/// Work of the partition that ended.
enum Job {
    Lane(BatchDone),
    /// A record run again alone after its backoff; `None`: abandoned
    /// uncommitted (the task stops).
    Retry {
        record: Record,
        outcome: Option<Outcome>,
        blocks: Option<Vec<u8>>,
        generation: u64,
    },
    /// Records of a blocked key; `None`: abandoned (the task stops).
    Hold {
        key: Vec<u8>,
        records: Vec<Record>,
        held: Option<Held>,
        generation: u64,
    },
}

pub(super) struct KeyedTask {
    at: Position,
    buffer: VecDeque<(Key, Record)>,
    /// When the oldest buffered record arrived: the linger clock.
    since: Option<Instant>,
    /// Offsets read and not yet settled (buffered, in a batch, waiting to be
    /// retried or being held), with their records' [`Record::bytes`]: the
    /// stored offset never passes the lowest.
    unsettled: BTreeMap<i64, usize>,
    /// The sum of `unsettled`'s bytes: what bounds reading, with the count.
    unsettled_bytes: usize,
    /// The offset after the last record kept (where reading goes on).
    high: Option<i64>,
    /// Records settled since the position was last written.
    settled: i64,
    /// Keys with work in flight: no other record of theirs starts.
    busy: HashSet<Key>,
    /// Keys with a parked letter: their records are held, not run. At its
    /// bound the partition stops reading.
    blocked: BlockedKeys,
    jobs: JoinSet<Job>,
    /// Batches among `jobs`.
    lanes: usize,
    /// Nothing could start at the last look: wait for a job or a record.
    stalled: bool,
    /// While the handler holds all it may: when to look again.
    probe_at: Option<Instant>,
}

impl KeyedTask {
    pub fn new(at: Position) -> Self {
        Self {
            at,
            buffer: VecDeque::new(),
            since: None,
            unsettled: BTreeMap::new(),
            unsettled_bytes: 0,
            high: None,
            settled: 0,
            busy: HashSet::new(),
            blocked: BlockedKeys::default(),
            jobs: JoinSet::new(),
            lanes: 0,
            stalled: false,
            probe_at: None,
        }
    }

    pub async fn run(mut self, stops: Stops) {
        let shared = self.at.shared.clone();
        let linger = Duration::from_millis(shared.batching.linger_ms);
        // What the partition may hold unsettled: its buffer, and its lanes full.
        let cap = shared.max_buffered + LANES * shared.batching.max_events;
        loop {
            if stops.revoked.is_cancelled() {
                break;
            }
            if self.at.shared.held_full.load(Relaxed) && self.probe_at.is_none_or(|at| at <= Instant::now()) {
                self.probe_at = Some(Instant::now() + FULL_PROBE);
                self.probe_room().await;
            }
            let full = self.at.shared.held_full.load(Relaxed);
            if !full {
                self.probe_at = None;
            }
            if let Some(first) = self.blocked.reload_due() {
                if first {
                    tracing::warn!(
                        handler = shared.handler,
                        topic = self.at.key.0,
                        partition = self.at.key.1,
                        "{MAX_BLOCKED_KEYS} keys of this partition are blocked by parked letters: it is not read \
                         until some are replayed or discarded (looked at every {RELOAD:?})"
                    );
                }
                let Some(read) = self.read_blocked(&stops.revoked).await else {
                    break;
                };
                let waiting = self.buffer.iter().filter_map(|(key, _)| key.as_ref());
                self.blocked.reloaded(read, waiting);
            }
            let reload_at = self.blocked.wake();
            if !self.stalled && !full {
                self.launch(linger, &stops);
            }
            let wake = match (self.stalled, self.since) {
                _ if full => self.probe_at,
                (false, Some(since)) if !self.buffer.is_empty() => Some(since + linger),
                _ => None,
            };
            let wake = match (wake, reload_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let room = self.unsettled.len() < cap
                && self.unsettled_bytes < MAX_UNSETTLED_BYTES
                && !self.blocked.full();
            tokio::select! {
                biased;
                _ = stops.revoked.cancelled() => break,
                Some(job) = self.jobs.join_next(), if !self.jobs.is_empty() => {
                    self.finished(ended(job), &stops, false);
                    self.raise(true).await;
                }
                _ = sleep_until(wake), if wake.is_some() => {}
                message = self.at.queue.recv(), if room => match message {
                    Ok(message) => {
                        let record = to_record(&message, self.at.shared.pipeline.kept_bytes());
                        drop(message);
                        if !self.accept(record, &stops.revoked).await {
                            break;
                        }
                        // A queue that always has a record never makes this
                        // task wait: yield when its share of the worker is used.
                        tokio::task::consume_budget().await;
                    }
                    Err(error) => self.at.consumer_error(&error).await,
                },
            }
        }
        // Work in flight ends its transaction first: committed or rolled back.
        while let Some(job) = self.jobs.join_next().await {
            self.finished(ended(job), &stops, true);
        }
        // Raising the position is right whoever owns the partition now; only
        // the owner tells Kafka.
        self.raise(!stops.revoked.is_cancelled() || stops.shutdown.is_cancelled())
            .await;
    }

    /// Buffers a record if the position says so. `false`: the task stops
    /// before the position was read.
    async fn accept(&mut self, record: Record, stop: &CancellationToken) -> bool {
        let (keep, clear) = match self.at.admit(&record, stop).await {
            Admit::Stop => return false,
            Admit::Keep { clear } => (true, clear),
            Admit::Skip { clear } => (false, clear),
        };
        if clear {
            self.forget();
            let Some(read) = self.read_blocked(stop).await else {
                return false;
            };
            self.blocked.replace(read);
        }
        if keep {
            if self.buffer.is_empty() {
                self.since = Some(Instant::now());
            }
            let bytes = record.bytes();
            self.unsettled_bytes += bytes;
            if let Some(old) = self.unsettled.insert(record.offset, bytes) {
                self.unsettled_bytes -= old;
            }
            self.high = Some(record.offset + 1);
            self.buffer.push_back((key_of(&record), record));
            self.stalled = false;
        }
        true
    }

    /// Forgets what was buffered: the position was re-read, and the
    /// partition is read again from there.
    fn forget(&mut self) {
        let forgotten: Vec<i64> = self.buffer.drain(..).map(|(_, record)| record.offset).collect();
        for offset in forgotten {
            self.unsettle(offset);
        }
        self.since = None;
        self.high = self.at.next;
    }

    /// Reads which of the partition's keys parked letters block (at most
    /// [`MAX_BLOCKED_KEYS`]); `None` if `stop` came first.
    async fn read_blocked(&self, stop: &CancellationToken) -> Option<HashSet<KeyDigest>> {
        let shared = self.at.shared.clone();
        let (topic, partition) = (&self.at.key.0, self.at.key.1);
        let read = shared
            .outage
            .retry("reading the keys held behind dead letters", stop, || async {
                dead_letters::blocked_keys(
                    shared.pipeline.db(),
                    &shared.handler,
                    topic,
                    partition,
                    MAX_BLOCKED_KEYS,
                )
                .await
                .map_err(PipelineError::from)
            });
        // Up to 4,096 statements on SQLite: a stop (a pause, a restart)
        // does not wait for them.
        tokio::select! {
            _ = stop.cancelled() => None,
            keys = read => keys,
        }
    }

    /// Starts what the buffered records allow, if they are due: batches
    /// over keys no work holds (up to the free lanes, the buffer shared out
    /// among them), and a hold for each blocked key.
    fn launch(&mut self, linger: Duration, stops: &Stops) {
        let shared = self.at.shared.clone();
        let max_events = shared.batching.max_events;
        let due = self.buffer.len() >= max_events || self.since.is_some_and(|s| s.elapsed() >= linger);
        if self.buffer.is_empty() || !due {
            return;
        }
        let free = LANES.saturating_sub(self.lanes);
        if free == 0 && self.blocked.is_empty() {
            // Neither a lane nor a hold can start: a job's end looks again.
            self.stalled = true;
            return;
        }
        let per_lane = self.buffer.len().div_ceil(free.max(1)).clamp(1, max_events);
        let room = shared.max_keys_in_flight.saturating_sub(self.busy.len());
        // The free keys' buffered records, key by key in the order of each
        // key's first record. A lane takes a key's records together (up to
        // a batch), so a key with many records waiting is not held up by a
        // lane's worth of other keys' records for each of its own.
        let mut order: Vec<&Key> = Vec::new();
        let mut of_key: HashMap<&Key, Vec<usize>> = HashMap::new();
        for (i, (key, _)) in self.buffer.iter().enumerate() {
            if self.busy.contains(key) {
                continue;
            }
            of_key
                .entry(key)
                .or_insert_with(|| {
                    order.push(key);
                    Vec::new()
                })
                .push(i);
        }
        let mut lanes: Vec<Vec<usize>> = Vec::new();
        let mut open: Vec<usize> = Vec::new();
        let mut holds: Vec<(KeyDigest, Vec<usize>)> = Vec::new();
        let mut new_keys = 0;
        for key in order {
            if new_keys >= room {
                break;
            }
            let mut indexes = of_key.remove(key).unwrap_or_default();
            if let Some(digest) = key.filter(|d| self.blocked.blocks(d)) {
                new_keys += 1;
                holds.push((digest, indexes));
                continue;
            }
            // At most a batch of one key at once; the rest waits for it.
            indexes.truncate(max_events);
            if !open.is_empty() && open.len() + indexes.len() > max_events {
                lanes.push(std::mem::take(&mut open));
            }
            if lanes.len() >= free {
                continue;
            }
            new_keys += 1;
            open.extend(indexes);
            if open.len() >= per_lane {
                lanes.push(std::mem::take(&mut open));
            }
        }
        if !open.is_empty() {
            lanes.push(open);
        }
        // Each lane in offset order (one key's records are already).
        for lane in &mut lanes {
            lane.sort_unstable();
        }
        if lanes.is_empty() && holds.is_empty() {
            self.stalled = true;
            return;
        }
        // Moved out, not copied (a record is up to `max_payload_bytes`).
        let mut slots: Vec<Option<(Key, Record)>> = self.buffer.drain(..).map(Some).collect();
        let mut take = |indexes: &[usize]| -> Vec<Record> {
            indexes
                .iter()
                .filter_map(|&i| slots[i].take().map(|(_, record)| record))
                .collect()
        };
        let lanes: Vec<Vec<Record>> = lanes.iter().map(|l| take(l)).collect();
        let holds: Vec<(KeyDigest, Vec<Record>)> = holds
            .into_iter()
            .map(|(key, indexes)| (key, take(&indexes)))
            .collect();
        self.buffer = slots.into_iter().flatten().collect();
        if self.buffer.is_empty() {
            self.since = None;
        }
        for records in lanes {
            self.busy.extend(records.iter().map(key_of));
            // Revoked, a lane's transaction ends as it would, but no wait
            // (a retry's backoff, an outage) holds the partition's next
            // task back: what it did not commit, the new owner runs.
            self.start_lane(records, &stops.revoked);
        }
        for (key, records) in holds {
            self.busy.insert(Some(key));
            let raw = records[0].key.clone().unwrap_or_default();
            self.start_hold(raw, records, &stops.revoked);
        }
    }

    fn start_lane(&mut self, records: Vec<Record>, shutdown: &CancellationToken) {
        let shared = &self.at.shared;
        let task = BatchTask {
            generation: self.at.generation,
            cursor: BatchCursor::keyed(),
            // A batch runs on the version current when it starts, to its end.
            pipeline: Arc::new(shared.pipeline.pinned()),
            outage: shared.outage.clone(),
        };
        self.lanes += 1;
        shared.batches_in_flight(1);
        let shutdown = shutdown.clone();
        self.jobs
            .spawn(async move { Job::Lane(task.run(records, shutdown).await) });
    }

    fn start_retry(&mut self, record: Record, deferred: Deferred, stop: &CancellationToken) {
        self.busy.insert(key_of(&record));
        let pipeline = Arc::new(self.at.shared.pipeline.pinned());
        let outage = self.at.shared.outage.clone();
        let (stop, generation) = (stop.clone(), self.at.generation);
        self.jobs.spawn(async move {
            let outcome = retry_alone(&pipeline, &outage, &record, deferred, &stop).await;
            let blocks = match outcome {
                Some(Outcome::DeadLettered) => pipeline.parked_blocks(&record),
                _ => None,
            };
            Job::Retry {
                record,
                outcome,
                blocks,
                generation,
            }
        });
    }

    fn start_hold(&mut self, key: Vec<u8>, records: Vec<Record>, stop: &CancellationToken) {
        let pipeline = Arc::new(self.at.shared.pipeline.pinned());
        let outage = self.at.shared.outage.clone();
        let max_held = self.at.shared.max_held_records;
        let (stop, generation) = (stop.clone(), self.at.generation);
        self.jobs.spawn(async move {
            let held = hold_or_park(&pipeline, &outage, &key, &records, max_held, &stop).await;
            Job::Hold {
                key,
                records,
                held,
                generation,
            }
        });
    }

    /// Takes in what a job settled and gives back what it did not run.
    /// `stopping`: nothing new starts.
    fn finished(&mut self, job: Job, stops: &Stops, stopping: bool) {
        self.stalled = false;
        match job {
            Job::Lane(BatchDone {
                generation,
                end,
                cursor,
                mut records,
            }) => {
                self.lanes -= 1;
                self.at.shared.batches_in_flight(-1);
                for record in &records {
                    self.busy.remove(&key_of(record));
                }
                for record in &records[..cursor.done] {
                    self.settle(record.offset);
                }
                self.blocked.learn(&cursor.parked_keys);
                let rest = records.split_off(cursor.done);
                match end {
                    BatchEnd::Returned(deferred) if !stopping && generation == self.at.generation => {
                        let mut rest = rest.into_iter();
                        if let Some(deferred) = deferred
                            && let Some(failed) = rest.next()
                        {
                            self.start_retry(failed, deferred, &stops.revoked);
                        }
                        self.requeue(rest.collect());
                    }
                    // Read again from the stored position (or never
                    // settled, if the task stops): no longer this task's.
                    _ => self.drop_unrun(&rest),
                }
            }
            Job::Retry {
                record,
                outcome,
                blocks,
                generation,
            } => {
                self.busy.remove(&key_of(&record));
                match outcome {
                    Some(_) => self.settle(record.offset),
                    None => self.drop_unrun(std::slice::from_ref(&record)),
                }
                if generation == self.at.generation {
                    self.blocked.learn(&blocks);
                }
            }
            Job::Hold {
                key,
                mut records,
                held,
                generation,
            } => {
                self.busy.remove(&Some(key_digest(&key)));
                let current = !stopping && generation == self.at.generation;
                let parked = match held {
                    Some(Held::Parked { count, .. }) => count,
                    _ => 0,
                };
                let rest = records.split_off(parked);
                records.iter().for_each(|r| self.settle(r.offset));
                match held {
                    Some(Held::Released) if current => {
                        self.blocked.release(&key);
                        self.requeue(rest);
                    }
                    // At the handler's bound: the rest waits for room.
                    Some(Held::Full { .. } | Held::Parked { .. }) if current && !rest.is_empty() => {
                        self.bound_reached(held);
                        self.requeue(rest);
                    }
                    _ => self.drop_unrun(&rest),
                }
            }
        }
    }

    /// The handler holds its `max_held_records`: every partition of it here
    /// stops taking records (see [`KeyedTask::probe_room`]).
    fn bound_reached(&mut self, held: Option<Held>) {
        if !self.at.shared.held_full.swap(true, Relaxed) {
            tracing::error!(
                handler = self.at.shared.handler,
                ?held,
                max_held_records = self.at.shared.max_held_records,
                "the handler holds as many records behind dead letters as it may: it takes no more records \
                 until an operator replays or discards some (inboxd dlq)"
            );
        }
    }

    /// With the handler at its `max_held_records`: whether an operator has
    /// made room since (then every partition of the handler goes on).
    async fn probe_room(&mut self) {
        let shared = &self.at.shared;
        match dead_letters::held_of(shared.pipeline.db(), &shared.handler).await {
            Ok(held) if (held as u64) < shared.max_held_records => {
                tracing::info!(
                    handler = shared.handler,
                    held,
                    "the handler holds fewer records than its max_held_records again: it goes on"
                );
                shared.held_full.store(false, Relaxed);
                self.stalled = false;
            }
            Ok(_) => {}
            Err(error) => tracing::debug!(handler = shared.handler, "counting held records failed: {error}"),
        }
    }

    fn settle(&mut self, offset: i64) {
        self.unsettle(offset);
        self.settled += 1;
    }

    /// Takes `offset` out of the unsettled ones, with its bytes.
    fn unsettle(&mut self, offset: i64) {
        if let Some(bytes) = self.unsettled.remove(&offset) {
            self.unsettled_bytes -= bytes;
        }
    }

    /// Records that will not run here: they stay unsettled if the task goes
    /// on (the position cannot pass them) unless the position was re-read,
    /// which reads them again.
    fn drop_unrun(&mut self, records: &[Record]) {
        for record in records {
            self.unsettle(record.offset);
        }
        if let (Some(first), Some(high)) = (records.first(), self.high) {
            self.high = Some(high.min(first.offset));
        }
    }

    /// Puts records given back into the buffer, in offset order, due at once.
    fn requeue(&mut self, records: Vec<Record>) {
        if records.is_empty() {
            return;
        }
        let given = records.into_iter().map(|record| (key_of(&record), record));
        let mut all: Vec<(Key, Record)> = self.buffer.drain(..).chain(given).collect();
        all.sort_by_key(|(_, record)| record.offset);
        self.buffer = all.into();
        let linger = Duration::from_millis(self.at.shared.batching.linger_ms);
        self.since = Some(Instant::now().checked_sub(linger).unwrap_or_else(Instant::now));
    }

    /// Raises the stored position to the lowest unsettled offset, if that
    /// moved; `tell`: then tells Kafka too.
    async fn raise(&mut self, tell: bool) {
        let lowest = self.unsettled.first_key_value().map(|(offset, _)| *offset);
        let Some(safe) = [lowest, self.high].into_iter().flatten().min() else {
            return;
        };
        if self.at.next.is_some_and(|next| next >= safe) {
            return;
        }
        let shared = &self.at.shared;
        let (topic, partition) = (&self.at.key.0, self.at.key.1);
        let db = shared.pipeline.db();
        match offsets::raise(db, &shared.handler, topic, partition, safe, self.settled).await {
            Ok(()) => {
                self.at.next = Some(safe);
                self.settled = 0;
                if tell {
                    self.at.store(safe);
                }
            }
            // Written with the next batch; a record above it that committed
            // is a duplicate if it comes again meanwhile.
            Err(error) => tracing::warn!(
                handler = shared.handler,
                topic,
                partition,
                "storing the partition's position failed ({error}); it is written after the next batch"
            ),
        }
    }
}

/// A job's result; a panic in it is the host's bug and goes on up.
fn ended(joined: Result<Job, tokio::task::JoinError>) -> Job {
    match joined {
        Ok(job) => job,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => panic!("a partition's job was cancelled: {error}"),
    }
}
