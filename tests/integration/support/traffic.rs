//! Orders to send: batches with re-sent copies, background trickles, and
//! waits for the stored offsets to move.

use super::*;

/// `unique_events` orders, then a re-sent copy of every `every`-th one (same
/// key, so the copy lands on the original's partition).
pub fn orders_with_duplicates(unique_events: usize, every: usize) -> Vec<Send> {
    let ids: Vec<String> = (0..unique_events).map(|_| new_id()).collect();
    let order = |(i, id): (usize, &String)| Send::order(id, &format!("o{i}"));
    let mut records: Vec<Send> = ids.iter().enumerate().map(order).collect();
    records.extend(ids.iter().enumerate().step_by(every).map(order));
    records
}

/// Waits (bounded) until the handler's stored offsets on `topic` add up to `at_least`.
pub async fn wait_for_progress(env: &TestEnv, topic: &str, at_least: i64) -> bool {
    let db = env.db().await;
    poll_until(Duration::from_secs(120), || {
        let (db, handler, topic) = (db.clone(), env.handler.clone(), topic.to_owned());
        async move { progress(&db, &handler, &topic).await.values().sum::<i64>() >= at_least }
    })
    .await
}

/// Keeps the later end of each partition.
pub fn merge_ends(ends: &mut std::collections::HashMap<i32, i64>, more: std::collections::HashMap<i32, i64>) {
    for (partition, end) in more {
        let entry = ends.entry(partition).or_default();
        *entry = end.max(*entry);
    }
}

/// Waits until the offsets stored for `env`'s handler on `topic` are
/// `more` records past where they stand now.
pub async fn progresses_by(env: &TestEnv, topic: &str, more: i64) -> bool {
    let now: i64 = stored_offsets(&env.db().await, &env.handler, topic)
        .await
        .values()
        .sum();
    wait_for_progress(env, topic, now + more).await
}

/// Orders arriving in the background ([`trickle_orders`]) until [`Trickle::stop`].
pub struct Trickle {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<(std::collections::HashMap<i32, i64>, usize)>,
}

impl Trickle {
    pub fn start(topic: &str) -> Self {
        Self::start_on(&brokers(), topic)
    }

    /// As [`Trickle::start`], to the broker at `brokers` (a test's own).
    pub fn start_on(brokers: &str, topic: &str) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(trickle_orders(brokers.to_owned(), topic.to_owned(), stop.clone()));
        Self { stop, task }
    }

    /// Stops the producer and merges its partitions' ends into `ends`;
    /// returns how many distinct orders it sent.
    pub async fn stop(self, ends: &mut std::collections::HashMap<i32, i64>) -> usize {
        self.stop.cancel();
        let (trickled_ends, trickled) = self.task.await.expect("the producer task");
        merge_ends(ends, trickled_ends);
        trickled
    }
}

/// Produces 100 new orders (and some re-sent copies) every 50 ms until
/// `stop`; returns the partitions' ends and how many distinct orders it sent.
pub async fn trickle_orders(
    brokers: String,
    topic: String,
    stop: tokio_util::sync::CancellationToken,
) -> (std::collections::HashMap<i32, i64>, usize) {
    let mut ends = std::collections::HashMap::new();
    let mut sent = 0;
    while !stop.is_cancelled() {
        merge_ends(
            &mut ends,
            produce_to(&brokers, &topic, &orders_with_duplicates(100, 5)).await,
        );
        sent += 100;
        // Pacing the producer, not waiting for anything.
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    (ends, sent)
}
