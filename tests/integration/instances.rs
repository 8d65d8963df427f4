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

/// Regression (the thirty-third and forty-fourth adversarial reads, issue
/// 23): the host's Wasm instances were first come first served, so a
/// hostile handler whose calls spin to their timeout could hold them all,
/// and the calls of every other handler waited their own (shorter)
/// timeouts and were retried without end. Now the pool must hold every
/// handler's calls at once (one per connection of its own: `wasm.instances
/// >= handlers x database.max_connections`, checked at start and at every
/// load), and a handler's calls run on its connections. Here the pool is
/// exactly two handlers' worth (2 x 2): the hostile handler spins on four
/// partitions with a 1.5 s timeout, and billing's orders, with a 300 ms
/// timeout and one attempt, are all applied and none ever waits for an
/// instance. A host whose calls took an instance before their connection
/// (the hostile one would hold four) fails this. (PostgreSQL: on SQLite
/// the one writer runs one call at a time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_gets_its_instances_however_long_another_holds_its_own() {
    let (orders, attacks) = (unique("orders"), unique("attacks"));
    create_topic(&orders, 1).await;
    create_topic(&attacks, 4).await;
    let rest = format!(
        "{}[handlers.limits]\ntimeout_ms = 300\n[handlers.retry]\nmax_attempts = 1\n\n\
         {}[handlers.limits]\ntimeout_ms = 1500\n[handlers.retry]\nmax_attempts = 1\n",
        handler_block("billing", &orders),
        handler_block("hostile", &attacks)
    );
    let env = TestEnv::with_handlers(Backend::Postgres, "billing", &orders, &rest).await;
    let config = std::fs::read_to_string(&env.config_path)
        .unwrap()
        .replace("[wasm]\n", "[wasm]\ninstances = 4\n")
        .replace("[database]\n", "[database]\nmax_connections = 2\n");
    std::fs::write(&env.config_path, config).unwrap();
    let loops: Vec<Send> = (0..12)
        .map(|_| Send::json(&new_id(), json!({ "attack": "loop" })))
        .collect();
    produce(&attacks, &loops).await;
    let mut host = env.spawn_host();
    // The orders go out once the hostile handler spins: its first events
    // have failed at their timeout, the next are spinning.
    let db = env.db().await;
    assert!(
        poll_until(Duration::from_secs(60), || {
            let db = &db;
            async move {
                inboxd::db::dead_letters::list(db, "hostile")
                    .await
                    .is_ok_and(|letters| !letters.is_empty())
            }
        })
        .await,
        "{}",
        host.log()
    );
    let order_ids: Vec<String> = (0..6).map(|_| new_id()).collect();
    let sends: Vec<Send> = order_ids
        .iter()
        .enumerate()
        .map(|(i, id)| Send::order(id, &format!("order-{i}")))
        .collect();
    let ends = produce(&orders, &sends).await;
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    let letters = inboxd::db::dead_letters::list(&db, "billing").await.unwrap();
    assert!(letters.is_empty(), "{letters:#?}\n{}", host.log());
    env.assert_exactly_once("invoices", order_ids.len(), &ends).await;
    // The hostile events, which spun, are the ones charged.
    assert!(
        poll_until(Duration::from_secs(60), || {
            let db = &db;
            async move { inboxd::db::dead_letters::list(db, "hostile").await.unwrap().len() == 12 }
        })
        .await,
        "{}",
        host.log()
    );
    assert!(
        !host
            .log()
            .contains("every Wasm instance of the host stayed in use"),
        "a call waited for an instance another handler held:\n{}",
        host.log()
    );
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}
