//! (d) A guest that loops forever and one that allocates without bound are
//! stopped with errors naming the limit; the host keeps running and the next
//! event is processed. A panicking guest is reported with its message.

use crate::on_both_backends;
use crate::support::*;
use inboxd::db::SqlValue;
use serde_json::json;
use std::time::Duration;

on_both_backends!(runaway_guests_are_stopped_by_named_limits_and_the_next_event_runs);

async fn runaway_guests_are_stopped_by_named_limits_and_the_next_event_runs(backend: Backend) {
    let topic = unique("attacks");
    create_topic(&topic, 1).await;
    let env = TestEnv::new(
        backend,
        "hostile",
        &topic,
        "[handlers.limits]\ntimeout_ms = 300\nmemory_mb = 32\n[handlers.retry]\nmax_attempts = 2\nbackoff_initial_ms = 10\nbackoff_max_ms = 20",
    ).await;

    let ids: Vec<String> = (0..6).map(|_| new_id()).collect();
    let attacks = ["loop", "ok", "memory", "ok", "panic", "ok"];
    let records: Vec<Send> = ids
        .iter()
        .zip(attacks)
        .map(|(id, attack)| Send::json(id, json!({ "attack": attack })))
        .collect();
    let ends = produce(&topic, &records).await;

    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    assert!(
        host.is_running(),
        "a runaway guest must not take the host down:\n{}",
        host.log()
    );

    let db = env.db().await;
    let effects_table = env.table("hostile_effects").await;
    let mut effects = rows(&db, &format!("SELECT event_id FROM {effects_table}")).await;
    effects.sort_by(|a, b| a[0].as_str().cmp(&b[0].as_str()));
    let mut expected: Vec<Vec<SqlValue>> = [1, 3, 5]
        .iter()
        .map(|&i| vec![SqlValue::Text(ids[i].clone())])
        .collect();
    expected.sort_by(|a, b| a[0].as_str().cmp(&b[0].as_str()));
    assert_eq!(effects, expected, "each event after an attack still ran");

    let letters = inboxd::db::dead_letters::list(&db, "hostile").await.unwrap();
    let by_offset: Vec<(i64, &str)> = letters.iter().map(|l| (l.offset, l.reason.as_str())).collect();
    assert_eq!(by_offset.len(), 3, "{by_offset:#?}");
    assert_eq!(by_offset[0].0, 0);
    assert!(by_offset[0].1.contains("limits.timeout_ms"), "{by_offset:#?}");
    assert_eq!(by_offset[1].0, 2);
    assert!(by_offset[1].1.contains("limits.memory_mb"), "{by_offset:#?}");
    assert_eq!(by_offset[2].0, 4);
    assert!(by_offset[2].1.contains("panicked on purpose"), "{by_offset:#?}");
    for letter in &letters {
        assert_eq!(letter.kind, "retries-exhausted");
        assert_eq!(
            letter.attempts, 2,
            "traps and limits are retried up to max_attempts"
        );
    }
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}
