//! (b) The host is SIGKILLed mid-stream and restarted: still exactly once, nothing missing.

use crate::on_both_backends;
use crate::support::*;
use std::time::Duration;

on_both_backends!(sigkill_mid_stream_then_restart_is_still_exactly_once);

async fn sigkill_mid_stream_then_restart_is_still_exactly_once(backend: Backend) {
    let topic = unique("orders");
    create_topic(&topic, 3).await;
    let env = TestEnv::new(backend, "billing", &topic, "").await;

    let unique_events = 3_000;
    let records = orders_with_duplicates(unique_events, 5);
    let ends = produce(&topic, &records).await;
    let total: i64 = ends.values().sum();

    let mut host = env.spawn_host();
    let db = env.db().await;
    let started = wait_for_progress(&env, &topic, total / 10).await;
    assert!(
        started,
        "the host made no progress before the kill:\n{}",
        host.log()
    );
    host.kill();

    let at_kill: i64 = stored_offsets(&db, &env.handler, &topic).await.values().sum();
    assert!(
        at_kill < total,
        "the kill came after the end ({at_kill}/{total}); the test proved nothing"
    );

    let mut restarted = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(180), &mut restarted)
        .await;
    assert_eq!(restarted.terminate(Duration::from_secs(30)).await, Some(0));
    // The restart does not recompile: the first start filled the compile cache.
    assert!(
        restarted
            .log()
            .contains("component loaded from the compile cache"),
        "{}",
        restarted.log()
    );
    env.assert_exactly_once("invoices", unique_events, &ends).await;
}
