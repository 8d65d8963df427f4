//! (a) Duplicates: every unique event is applied exactly once, and the stored
//! offsets reach the end of every partition. Also: SIGTERM drains and exits 0.

use crate::support::*;
use rand::seq::SliceRandom;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_applied_once_and_offsets_reach_the_end() {
    let topic = unique("orders");
    create_topic(&topic, 3).await;
    let env = TestEnv::new("billing", &topic, "");

    let unique_events = 2_000;
    let ids: Vec<String> = (0..unique_events).map(|_| new_id()).collect();
    let mut records: Vec<Send> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| Send::order(id, &format!("o{i}")))
        .collect();
    // 25% duplicates, re-sent with the same key so they land on the same partition.
    records.extend(ids.iter().step_by(4).map(|id| {
        let i = ids.iter().position(|x| x == id).unwrap();
        Send::order(id, &format!("o{i}"))
    }));
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

    let db = env.db().await;
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM invoices").await,
        unique_events as i64,
        "one invoice per unique event"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM (SELECT event_id FROM invoices GROUP BY event_id HAVING COUNT(*) > 1) d").await,
        0,
        "no event applied twice"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM inbox WHERE status = 'done'").await,
        unique_events as i64
    );
    assert_eq!(count(&db, "SELECT COUNT(*) FROM dead_letters").await, 0);
    assert_eq!(
        stored_offsets(&db, &env.handler, &topic).await,
        ends,
        "stored offsets are exactly the ends"
    );
}
