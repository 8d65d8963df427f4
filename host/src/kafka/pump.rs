//! The consume loop of one handler: a task per assigned partition
//! ([`super::partition`]), started and stopped as the group rebalances.
//!
//! Every assigned partition's records come on a queue of its own (split off
//! in the rebalance callback, see [`super::consumer`]), so a partition has at
//! most one batch in flight and its records commit in order, while different
//! partitions' batches run in parallel, each on a connection of its own. This
//! loop serves the consumer's own queue: rebalances, errors, and any record
//! that arrived there because its partition could not be split.
//!
//! Shutdown: batches in flight finish their transaction (one waiting to retry
//! a failed handler is abandoned uncommitted) and buffered records are
//! dropped; all of them are redelivered. Nothing is ever half-applied.

use super::consumer::{InboxConsumer, InboxContext, PartitionKey, PartitionQueue};
use super::keyed::KeyedTask;
use super::outage::OutageLog;
use super::partition::{PartitionTask, Position, Shared, Stops, max_buffered};
use crate::config::{BatchConfig, Ordering};
use crate::pipeline::Pipeline;
use rdkafka::Message;
use rdkafka::consumer::Consumer;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// A handler's ordering and, with key order, its bounds.
pub struct KeyOrder {
    pub ordering: Ordering,
    pub max_keys_in_flight: usize,
    pub max_held_records: u64,
}

impl KeyOrder {
    pub fn of(config: &crate::config::HandlerConfig) -> Self {
        Self {
            ordering: config.ordering,
            max_keys_in_flight: config.max_keys_in_flight,
            max_held_records: config.max_held_records,
        }
    }
}

/// Consumes until `shutdown` is cancelled, then commits to Kafka and leaves the group.
pub async fn run_pump(
    consumer: InboxConsumer,
    pipeline: Pipeline,
    batching: BatchConfig,
    ordering: KeyOrder,
    shutdown: CancellationToken,
) {
    let consumer = Arc::new(consumer);
    InboxContext::attach(&consumer);
    let shared = Arc::new(Shared {
        handler: pipeline.handler_name().to_owned(),
        ordering: ordering.ordering,
        max_keys_in_flight: ordering.max_keys_in_flight,
        max_held_records: ordering.max_held_records,
        held_full: Default::default(),
        pipeline: Arc::new(pipeline),
        consumer: consumer.clone(),
        max_buffered: max_buffered(&batching),
        batching,
        outage: Arc::new(OutageLog::default()),
        in_flight: AtomicUsize::new(0),
    });
    let mut pump = Pump {
        shared,
        consumer,
        partitions: HashMap::new(),
        ended: HashMap::new(),
        tasks: JoinSet::new(),
        strays: HashMap::new(),
    };
    pump.run(&shutdown).await;
}

struct Pump {
    shared: Arc<Shared>,
    consumer: Arc<InboxConsumer>,
    /// The running partition tasks, by what revokes them.
    partitions: HashMap<PartitionKey, CancellationToken>,
    /// Cancelled when a partition's latest task has ended: the next one for
    /// the partition waits for it (see [`Pump::start`]).
    ended: HashMap<PartitionKey, CancellationToken>,
    tasks: JoinSet<()>,
    /// Partitions started over because their records came on the consumer's
    /// queue, with the lowest such record's offset.
    strays: HashMap<PartitionKey, i64>,
}

impl Pump {
    async fn run(&mut self, shutdown: &CancellationToken) {
        let handler = self.shared.handler.clone();
        loop {
            self.follow_rebalances(shutdown);
            let context = self.consumer.context();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = context.changed() => {}
                Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Err(error) = joined {
                        tracing::error!(handler, "a partition's task panicked: {error}");
                        shutdown.cancel();
                        break;
                    }
                }
                message = self.consumer.recv() => match message {
                    Ok(message) => {
                        let key = (message.topic().to_owned(), message.partition());
                        let offset = message.offset();
                        drop(message);
                        self.stray(key, offset, shutdown);
                    }
                    Err(error) => {
                        tracing::warn!(handler, "kafka consumer error: {error}");
                        // librdkafka reconnects by itself; this only keeps a
                        // persistent error from flooding the log.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                },
            }
        }
        // Batches in flight end their transaction first: committed or rolled back.
        shutdown.cancel();
        while let Some(joined) = self.tasks.join_next().await {
            if let Err(error) = joined {
                tracing::error!(handler, "a partition's task panicked: {error}");
            }
        }
        // The queues hold the consumer: let it go.
        self.consumer.context().release_queues();
        // Leaving the group commits the offsets stored so far (auto commit,
        // see `create_consumer`), the last batches' included.
        self.consumer.unsubscribe();
        tracing::info!(handler, "consumer stopped and left its group");
    }

    /// Stops the tasks of revoked partitions, then starts one for each
    /// assigned partition (revokes first: a partition revoked and assigned
    /// again gets a new task, which re-reads its position).
    fn follow_rebalances(&mut self, shutdown: &CancellationToken) {
        let context = self.consumer.context();
        for key in context.take_revoked() {
            self.strays.remove(&key);
            if let Some(revoked) = self.partitions.remove(&key) {
                revoked.cancel();
            }
        }
        for (key, queue) in context.take_assigned() {
            self.start(key, queue, None, shutdown);
        }
    }

    /// `floor`: where the partition starts if the database has no position for it.
    fn start(
        &mut self,
        key: PartitionKey,
        queue: Arc<PartitionQueue>,
        floor: Option<i64>,
        shutdown: &CancellationToken,
    ) {
        let stops = Stops {
            shutdown: shutdown.clone(),
            revoked: shutdown.child_token(),
        };
        if let Some(old) = self.partitions.insert(key.clone(), stops.revoked.clone()) {
            old.cancel();
        }
        // With key order, a partition assigned again starts only once its
        // last task has ended (its work in flight committed or rolled back):
        // two tasks of one partition would run one key's records side by
        // side, and nothing in their transactions fences one from the other.
        // (With partition order, the offset's compare-and-set fences them.)
        let ended = CancellationToken::new();
        let previous = self
            .ended
            .insert(key.clone(), ended.clone())
            .filter(|_| self.shared.ordering == Ordering::Key);
        let at = Position::new(key, queue, floor, self.shared.clone());
        let ordering = self.shared.ordering;
        self.tasks.spawn(async move {
            // Cancelled however this ends (a panic included).
            let _ended = ended.drop_guard();
            if let Some(previous) = previous {
                previous.cancelled().await;
            }
            match ordering {
                Ordering::Partition => PartitionTask::new(at).run(stops).await,
                Ordering::Key => KeyedTask::new(at).run(stops).await,
            }
        });
    }

    /// A record on the consumer's own queue (its partition could not be split
    /// when it was assigned): the partition starts over on a queue of its own,
    /// sought to its position in the database, or to the lowest such record
    /// if the database has none; the seek drops what was fetched before.
    /// Nothing is processed from the consumer's queue.
    fn stray(&mut self, key: PartitionKey, offset: i64, shutdown: &CancellationToken) {
        if self.strays.get(&key).is_some_and(|floor| *floor <= offset) {
            // Fetched before the partition started over: it comes again.
            return;
        }
        let (topic, partition) = (key.0.clone(), key.1);
        let Some(queue) = self.consumer.context().split(&topic, partition) else {
            tracing::error!(
                handler = self.shared.handler,
                topic,
                partition,
                offset,
                "a record came on the consumer's queue and its partition cannot be split: not processed"
            );
            return;
        };
        tracing::warn!(
            handler = self.shared.handler,
            topic,
            partition,
            offset,
            "a record came on the consumer's queue, not its partition's: starting the partition over"
        );
        self.strays.insert(key.clone(), offset);
        self.start(key, queue, Some(offset), shutdown);
    }
}
