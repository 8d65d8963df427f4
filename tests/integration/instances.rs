//! Instance reuse (`instances.reuse`): consecutive events share an instance
//! until it has handled `recycle_after_events` or its memory passes
//! `recycle_memory_mb`, and a trap always ends it. Without reuse (the
//! default) every event gets a fresh instance. The hostile guest's `count`
//! event records how many events its instance has seen, so the rows show
//! which instance ran each event.

use crate::support::*;
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

/// Runs `events` (attack payloads) through a one-partition topic and returns,
/// per event, what its instance's count was (events that wrote no row: absent).
async fn counts_seen(handler_toml: &str, events: &[serde_json::Value]) -> Vec<Option<u32>> {
    let topic = unique("instances");
    create_topic(&topic, 1).await;
    let env = TestEnv::new(Backend::Sqlite, "hostile", &topic, handler_toml).await;
    let ids: Vec<String> = events.iter().map(|_| new_id()).collect();
    let records: Vec<Send> = ids
        .iter()
        .zip(events)
        .map(|(id, payload)| Send::json(id, payload.clone()))
        .collect();
    let ends = produce(&topic, &records).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
    let db = env.db().await;
    let table = env.table("hostile_effects").await;
    let seen: HashMap<String, u32> = rows(&db, &format!("SELECT event_id FROM {table}"))
        .await
        .into_iter()
        .filter_map(|row| {
            let text = row[0].as_str()?.to_owned();
            let (id, n) = text.split_once(' ')?;
            Some((id.to_owned(), n.parse().ok()?))
        })
        .collect();
    ids.iter().map(|id| seen.get(id).copied()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_instances_are_recycled_by_count_memory_and_trap() {
    let count = json!({ "attack": "count" });
    let events = [
        count.clone(),
        count.clone(),
        count.clone(),
        count.clone(), // the fourth event on one instance: past recycle_after_events
        json!({ "attack": "grow", "mib": 12 }), // past recycle_memory_mb
        count.clone(),
        json!({ "attack": "panic" }), // a trap
        count.clone(),
    ];
    let toml = "[handlers.instances]\nreuse = true\nrecycle_after_events = 3\nrecycle_memory_mb = 8\n\
                [handlers.retry]\nmax_attempts = 1";
    let seen = counts_seen(toml, &events).await;
    assert_eq!(
        seen,
        [
            Some(1),
            Some(2),
            Some(3),
            Some(1),
            Some(2),
            Some(1),
            None,
            Some(1)
        ],
        "instance counts per event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reuse_every_event_gets_a_fresh_instance() {
    let events = vec![json!({ "attack": "count" }); 4];
    let seen = counts_seen("", &events).await;
    assert_eq!(seen, [Some(1); 4]);
}
