//! (a) Duplicates: every unique event is applied exactly once, and the stored
//! offsets reach the end of every partition. Also: SIGTERM drains and exits 0,
//! and Kafka's committed offsets then equal the database's.

use crate::on_both_backends;
use crate::support::*;
use rand::seq::SliceRandom;
use std::time::Duration;

on_both_backends!(duplicates_are_applied_once_and_offsets_reach_the_end);

async fn duplicates_are_applied_once_and_offsets_reach_the_end(backend: Backend) {
    let topic = unique("orders");
    create_topic(&topic, 3).await;
    let env = TestEnv::new(backend, "billing", &topic, "").await;

    let unique_events = 2_000;
    // 25% duplicates, re-sent with the same key so they land on the same partition.
    let mut records = orders_with_duplicates(unique_events, 4);
    records.shuffle(&mut rand::rng());
    let ends = produce(&topic, &records).await;

    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(180), &mut host)
        .await;
    assert_eq!(
        host.terminate(Duration::from_secs(30)).await,
        Some(0),
        "SIGTERM drains and exits 0:\n{}",
        host.log()
    );

    env.assert_exactly_once("invoices", unique_events, &ends).await;
    let db = env.db().await;
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM inbox WHERE status = 'done'").await,
        unique_events as i64
    );
    assert_eq!(count(&db, "SELECT COUNT(*) FROM dead_letters").await, 0);
    // Kafka heard of every committed batch (lag tools read this), the last
    // ones when the host left the group.
    let stored = stored_offsets(&db, &env.handler, &topic).await;
    assert_eq!(
        kafka_committed(&group_of(&env.config_path), &topic, 3).await,
        stored,
        "Kafka's committed offsets are the database's after a clean stop"
    );
}
