//! (b) The host is SIGKILLed mid-stream and restarted: still exactly once, nothing missing.

use crate::support::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_then_restart_is_still_exactly_once() {
    let topic = unique("orders");
    create_topic(&topic, 3).await;
    let env = TestEnv::new("billing", &topic, "");

    let unique_events = 3_000;
    let ids: Vec<String> = (0..unique_events).map(|_| new_id()).collect();
    let mut records: Vec<Send> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| Send::order(id, &format!("o{i}")))
        .collect();
    records.extend(
        ids.iter()
            .enumerate()
            .step_by(5)
            .map(|(i, id)| Send::order(id, &format!("o{i}"))),
    );
    let ends = produce(&topic, &records).await;
    let total: i64 = ends.values().sum();

    let mut host = env.spawn_host();
    let db = env.db().await;
    let started = poll_until(Duration::from_secs(120), || {
        let db = db.clone();
        let (handler, topic) = (env.handler.clone(), topic.clone());
        async move { progress(&db, &handler, &topic).await.values().sum::<i64>() >= total / 10 }
    })
    .await;
    assert!(
        started,
        "the host made no progress before the kill:\n{}",
        host.log()
    );
    host.kill();

    let at_kill: i64 = stored_offsets(&db, &env.handler, &topic)
        .await
        .values()
        .sum();
    assert!(
        at_kill < total,
        "the kill came after the end ({at_kill}/{total}); the test proved nothing"
    );
    let invoices_at_kill = count(&db, "SELECT COUNT(*) FROM invoices").await;

    let mut restarted = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(180), &mut restarted)
        .await;
    assert_eq!(restarted.terminate(Duration::from_secs(30)).await, Some(0));

    assert!(invoices_at_kill < unique_events as i64);
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM invoices").await,
        unique_events as i64,
        "nothing missing"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM (SELECT event_id FROM invoices GROUP BY event_id HAVING COUNT(*) > 1) d").await,
        0,
        "nothing applied twice across the crash"
    );
    assert_eq!(stored_offsets(&db, &env.handler, &topic).await, ends);
}
