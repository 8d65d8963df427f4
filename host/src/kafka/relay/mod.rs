//! The outbox relay: committed outbox rows to Kafka, at least once, in order
//! per (handler, key).
//!
//! Each host runs one relay. A relay leases buckets of the outbox (a lease it
//! renews every few seconds and that runs out if the host dies, so another
//! host picks the bucket up) and sends a bucket's messages in insert order
//! with an idempotent producer of the message's handler (see [`producers`]:
//! one team's refused message must not pause the others), each with its id
//! in the `event_id` header.
//! Rows are marked published only after Kafka acknowledged them: a crash in
//! between sends them again, and the consuming handler's inbox drops the copy.
//!
//! Buckets never wait for each other, nor handlers: each bucket's sends run
//! as their own task; a handler whose deliveries are slow (a topic whose
//! leader is away, a topic librdkafka waits up to 30 s to call missing) is
//! set aside after [`send::LANE_WAIT`] to *straggle* on a task of its own, its
//! messages unread meanwhile, so the bucket is free for the others (one
//! stuck message once held its whole bucket for a delivery timeout, and a
//! team with 64 of them every bucket: the fifty-third read); and a handler
//! whose message fails for a passing reason
//! (the broker away, a topic that does not exist yet) backs off alone: its
//! later messages wait behind it, keeping its order, while the other
//! handlers' messages in the same buckets go on (a whole bucket once backed
//! off, so one team's failing messages held back every team whose messages
//! hashed to its buckets: the forty-ninth read). A
//! message the broker will never accept (an invalid topic name, a message
//! over the size limit, a topic the relay may not write: see [`permanent`])
//! is *parked* at once with its reason, and the bucket goes on with the
//! messages after it; `inboxd outbox` and the admin API show, re-queue or
//! discard parked messages. A message to a topic the broker says does not
//! exist waits like any passing failure, but not for ever: see
//! [`missing_topics`](super::missing_topics).

mod producers;
mod send;

use super::missing_topics::MissingTopics;
use crate::config::{KafkaConfig, RetryConfig};
use crate::db::outbox::{self, Pending, Settle};
use crate::db::{Database, DbError};
use crate::failpoints;
use crate::pipeline::backoff;
use futures_util::FutureExt;
use producers::Producers;
use send::{Failed, Outcome, Senders, Straggling, await_in_order, send_in_order};
#[cfg(test)]
use send::{invalid_topic, permanent};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// A bucket lease lasts this long unless renewed: how long a dead host's
/// messages wait before another host relays them.
const LEASE_MS: i64 = 10_000;
/// Leases are renewed (and free buckets taken) this often: well inside
/// `LEASE_MS`, and rarely enough not to write the lease rows on every look.
const RENEW: Duration = Duration::from_secs(2);
/// How long the relay gathers finished buckets before marking them published.
const SETTLE_WINDOW: Duration = Duration::from_millis(50);
/// Idle wait between looks at the outbox: the relay's added latency.
const POLL: Duration = Duration::from_millis(100);
/// Messages read and sent per bucket at a time. Per bucket, so one bucket's
/// backlog never fills a read.
const PER_BUCKET: i64 = 200;
/// Message bytes (key, payload, headers) the relay holds at once, over every
/// bucket in flight. A count alone bounds nothing: messages are as large as
/// handlers make them, and 64 buckets of 200 one-megabyte messages were
/// 12.8 GB. A single message larger than this still goes, alone, when
/// nothing else is in flight.
const HELD_BYTES: u64 = 64 * 1024 * 1024;
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of straggling messages held before they count against
/// [`HELD_BYTES`]. Regression (the review of the fifty-third read): at
/// `HELD_BYTES`, two handlers straggling with a read's worth each stopped
/// every read for as long as librdkafka waited on them (30 s), again and
/// again. Now it takes five handlers with 64 MiB each of messages to slow
/// topics at once; a fair share per team would close it (open).
const STRAGGLING_BYTES: u64 = 4 * HELD_BYTES;
const RETRY: RetryConfig = RetryConfig {
    max_attempts: u32::MAX,
    backoff_initial_ms: 100,
    backoff_max_ms: 5_000,
};

/// Relays until `shutdown`, then gives its leases up.
pub async fn run_relay(
    db: Database,
    kafka: KafkaConfig,
    owner: String,
    settle: Settle,
    shutdown: CancellationToken,
) {
    let make: producers::MakeProducer =
        Box::new(move |handler| producers::for_handler(&kafka, handler, DELIVERY_TIMEOUT));
    let mut relay = Relay::new(db.clone(), Producers::new(make), owner.clone(), settle);
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        // Anything sent but not yet marked when shutdown comes is sent again
        // later, which the consumer's inbox absorbs: shutdown does not wait.
        let wait = match relay.step(&shutdown).await {
            Ok(()) => {
                failures = 0;
                continue;
            }
            Err(error) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!("the outbox relay failed, retrying with backoff: {error}");
                }
                backoff(&RETRY, failures.min(16))
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    drop(relay);
    if let Err(error) = outbox::release(&db, &owner).await {
        tracing::debug!("releasing the outbox leases failed (they run out by themselves): {error}");
    }
}

/// The relay's state between looks at the outbox.
pub(crate) struct Relay {
    db: Database,
    producers: Producers,
    owner: String,
    /// Whether a sent message is deleted or kept (`outbox.retention`).
    settle: Settle,
    held: Vec<i64>,
    renewed: Option<Instant>,
    /// Buckets whose sends are in flight, with the bytes of their messages;
    /// and those sends.
    busy: HashMap<i64, u64>,
    in_flight: JoinSet<(i64, Outcome)>,
    /// Each send task's bucket: what a task that ends without an outcome
    /// (a `JoinError`) hands back, so its bytes are not counted in flight for good.
    tasks: HashMap<tokio::task::Id, i64>,
    /// Handlers backing off after a passing failure: until when, and how
    /// many failures in a row. Their messages are not read meanwhile.
    waiting: HashMap<String, (Instant, u32)>,
    missing: MissingTopics,
    /// Handlers with messages straggling (see [`Straggling`]), how many
    /// sets of them, and their bytes in all: their messages are not read
    /// meanwhile. The tasks awaiting them yield each handler's outcome.
    straggling: HashMap<String, usize>,
    straggling_bytes: u64,
    stragglers: JoinSet<(String, u64, Outcome)>,
}

impl Relay {
    pub(crate) fn new(db: Database, producers: Producers, owner: String, settle: Settle) -> Self {
        Self {
            db,
            producers,
            owner,
            settle,
            held: Vec::new(),
            renewed: None,
            busy: HashMap::new(),
            in_flight: JoinSet::new(),
            tasks: HashMap::new(),
            waiting: HashMap::new(),
            missing: MissingTopics::default(),
            straggling: HashMap::new(),
            straggling_bytes: 0,
            stragglers: JoinSet::new(),
        }
    }

    /// One look: start the buckets that have messages and are free to send,
    /// then wait for a bucket to finish (settling every finished one) or
    /// for the poll interval.
    pub(crate) async fn step(&mut self, shutdown: &CancellationToken) -> Result<(), DbError> {
        self.start_ready().await?;
        tokio::select! {
            _ = shutdown.cancelled() => Ok(()),
            Some(joined) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                let mut finished = vec![joined];
                // The other buckets usually finish moments later: gather them
                // for a short while, so one write (a commit, an fsync) marks
                // them all instead of one per bucket competing with the
                // pipeline's commits; a slow bucket is not waited for longer.
                let window = tokio::time::sleep(SETTLE_WINDOW);
                tokio::pin!(window);
                while !self.in_flight.is_empty() {
                    tokio::select! {
                        _ = &mut window => break,
                        Some(joined) = self.in_flight.join_next() => finished.push(joined),
                    }
                }
                let finished = finished
                    .into_iter()
                    .filter_map(|joined| match joined {
                        Ok(done) => Some(done),
                        Err(error) => {
                            // Its bucket is handed back with nothing settled:
                            // its messages are still pending and are read again.
                            tracing::error!("an outbox send task failed: {error}");
                            if let Some(bucket) = self.tasks.remove(&error.id()) {
                                self.busy.remove(&bucket);
                            }
                            None
                        }
                    })
                    .collect();
                self.settle(finished).await
            }
            Some(joined) = self.stragglers.join_next(), if !self.stragglers.is_empty() => {
                match joined {
                    Ok((handler, bytes, outcome)) => {
                        self.straggled(&handler, bytes);
                        self.settle_outcomes(vec![outcome]).await
                    }
                    // Only an abort ends such a task without an outcome
                    // (a panic is caught in it): the relay is stopping.
                    Err(error) => {
                        tracing::error!("an outbox straggler task failed: {error}");
                        Ok(())
                    }
                }
            }
            _ = tokio::time::sleep(POLL) => Ok(()),
        }
    }

    async fn start_ready(&mut self) -> Result<(), DbError> {
        if self.renewed.is_none_or(|at| at.elapsed() >= RENEW) {
            self.held = outbox::lease(&self.db, &self.owner, LEASE_MS).await?;
            self.renewed = Some(Instant::now());
            self.producers.close_idle();
        }
        let now = Instant::now();
        let ready: Vec<i64> = self
            .held
            .iter()
            .copied()
            .filter(|b| !self.busy.contains_key(b))
            .collect();
        let backing_off: Vec<String> = self
            .waiting
            .iter()
            .filter(|(_, (until, _))| *until > now)
            .map(|(handler, _)| handler.clone())
            .chain(self.straggling.keys().cloned())
            .collect();
        // Stragglers hold their messages too, but each handler only what one
        // read gave it (it is not read again until they end), so they count
        // only past a budget of their own, `STRAGGLING_BYTES`: a few slow
        // handlers do not stop the reads of the others.
        let held: u64 =
            self.busy.values().sum::<u64>() + self.straggling_bytes.saturating_sub(STRAGGLING_BYTES);
        if held >= HELD_BYTES {
            return Ok(());
        }
        let read = outbox::Read {
            per_bucket: PER_BUCKET,
            bytes: HELD_BYTES - held,
            at_least_one: self.busy.is_empty(),
        };
        let pending = outbox::pending(&self.db, &ready, read, &backing_off).await?;
        if pending.is_empty() {
            return Ok(());
        }
        failpoints::hit("relay-before-publish");
        let quarantined = self.missing.quarantined();
        for rows in by_bucket(pending) {
            let number = rows[0].bucket;
            let mut senders = Senders::new();
            for row in &rows {
                if !senders.contains_key(&row.handler) {
                    senders.insert(row.handler.clone(), self.producers.get(&row.handler));
                }
            }
            let quarantined = quarantined.clone();
            let bytes = rows.iter().map(|row| row.message.bytes() as u64).sum();
            self.busy.insert(number, bytes);
            let task = self.in_flight.spawn(async move {
                // A send that panics must still hand its bucket back (else
                // the bucket is busy for good and its lease keeps others off):
                // it counts as a passing failure of the bucket's first message.
                let (first, first_handler) = (rows[0].seq, rows[0].handler.clone());
                let sent =
                    std::panic::AssertUnwindSafe(send_in_order(&senders, &rows, &quarantined)).catch_unwind();
                let outcome = sent.await.unwrap_or_else(|_| Outcome {
                    failed: vec![Failed {
                        handler: first_handler,
                        seq: first,
                        error: "the relay's send task panicked".to_owned(),
                        missing_topic: None,
                    }],
                    ..Outcome::default()
                });
                (number, outcome)
            });
            self.tasks.insert(task.id(), number);
        }
        Ok(())
    }

    /// Records what the finished buckets did: one write for everything
    /// published, then each parked message and each bucket's failure.
    async fn settle(&mut self, finished: Vec<(i64, Outcome)>) -> Result<(), DbError> {
        let mut outcomes = Vec::with_capacity(finished.len());
        for (bucket, mut outcome) in finished {
            self.busy.remove(&bucket);
            for straggling in std::mem::take(&mut outcome.straggling) {
                self.straggle(straggling);
            }
            outcomes.push(outcome);
        }
        // Tasks are few (one per bucket in flight): forget the finished ones.
        self.tasks.retain(|_, bucket| self.busy.contains_key(bucket));
        self.settle_outcomes(outcomes).await
    }

    /// Sets a handler's unacknowledged messages aside on a task of their
    /// own; the handler is not read until every such set of it has ended.
    fn straggle(&mut self, straggling: Straggling) {
        let Straggling {
            handler,
            bytes,
            sends,
        } = straggling;
        tracing::info!(
            handler,
            messages = sends.len(),
            "outbox deliveries are slow; the handler's messages wait for them while the other \
             handlers' go on"
        );
        *self.straggling.entry(handler.clone()).or_default() += 1;
        self.straggling_bytes += bytes;
        self.stragglers.spawn(async move {
            let mut outcome = Outcome::default();
            // A panic must still end the set (else its handler is never
            // read again): what it held is pending still, and sent again.
            let waited = std::panic::AssertUnwindSafe(await_in_order(sends, &handler, &mut outcome));
            if waited.catch_unwind().await.is_err() {
                outcome = Outcome::default();
            }
            (handler, bytes, outcome)
        });
    }

    /// One set of `handler`'s straggling messages ended.
    fn straggled(&mut self, handler: &str, bytes: u64) {
        self.straggling_bytes = self.straggling_bytes.saturating_sub(bytes);
        if let Some(sets) = self.straggling.get_mut(handler) {
            *sets -= 1;
            if *sets == 0 {
                self.straggling.remove(handler);
            }
        }
    }

    /// Records what sends did: one write for everything published, then
    /// each parked message and each handler's failure.
    async fn settle_outcomes(&mut self, finished: Vec<Outcome>) -> Result<(), DbError> {
        let published: Vec<i64> = finished
            .iter()
            .flat_map(|o| o.published.iter().copied())
            .collect();
        if !published.is_empty() {
            failpoints::hit("relay-after-publish");
        }
        outbox::settle_sent(&self.db, &published, self.settle).await?;
        // Every message parked in this round, written together: a team
        // decides how many (1,000 messages per event to a quarantined topic,
        // and as often re-queued), and one write each, in the relay's only
        // loop, held every team's delivery for minutes (the eleventh read).
        let mut parked: Vec<(i64, String)> = Vec::new();
        let mut backing_off: Vec<&Failed> = Vec::new();
        for outcome in &finished {
            parked.extend(outcome.parked.iter().cloned());
            for failed in &outcome.failed {
                if let Some(topic) = &failed.missing_topic
                    && let Some(reason) =
                        self.missing
                            .failed(failed.seq, &failed.handler, topic, &failed.error)
                {
                    tracing::warn!(
                        seq = failed.seq,
                        topic,
                        "an outbox message to a missing topic is parked: {reason}"
                    );
                    parked.push((failed.seq, reason));
                    // Parked, it no longer holds its handler's line up.
                    self.waiting.remove(&failed.handler);
                    continue;
                }
                backing_off.push(failed);
            }
        }
        if !parked.is_empty() {
            tracing::warn!(
                count = parked.len(),
                first = parked[0].0,
                "outbox messages the broker will never accept are parked \
                 (`inboxd outbox list` shows them; retry or discard them): {}",
                parked[0].1
            );
            outbox::park_all(&self.db, &parked).await?;
        }
        // A handler whose messages went, and none failed, backs off no more.
        let failing: HashSet<&str> = finished
            .iter()
            .flat_map(|outcome| outcome.failed.iter().map(|f| f.handler.as_str()))
            .collect();
        for outcome in &finished {
            for handler in outcome.went.iter().filter(|h| !failing.contains(h.as_str())) {
                self.waiting.remove(handler);
            }
        }
        for failed in backing_off {
            if failed.missing_topic.is_none() {
                self.missing.settled(&failed.handler, failed.seq);
            }
            let failures = self.waiting.get(&failed.handler).map_or(0, |(_, n)| *n) + 1;
            if failures == 1 {
                tracing::warn!(
                    seq = failed.seq,
                    handler = failed.handler,
                    "relaying an outbox message failed; the handler's messages retry with backoff: {}",
                    failed.error
                );
            }
            let until = Instant::now() + backoff(&RETRY, failures.min(16));
            self.waiting.insert(failed.handler.clone(), (until, failures));
            outbox::record_failure(&self.db, failed.seq, &failed.error).await?;
        }
        Ok(())
    }
}

/// The rows of a read (in bucket order) as one list per bucket, moved, not
/// copied: a read may be tens of megabytes.
fn by_bucket(rows: Vec<Pending>) -> Vec<Vec<Pending>> {
    let mut buckets: Vec<Vec<Pending>> = Vec::new();
    for row in rows {
        match buckets.last_mut() {
            Some(last) if last[0].bucket == row.bucket => last.push(row),
            _ => buckets.push(vec![row]),
        }
    }
    buckets
}

#[cfg(test)]
mod tests;
