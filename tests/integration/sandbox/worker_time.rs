//! Host code a guest's input drives must not hold a runtime thread: what
//! the host checks before running a statement is linear in its input, so
//! the largest input a handler may bind costs milliseconds.

use crate::support::*;
use serde_json::json;
use std::time::Duration;

/// Regression (issue 23, the forty-eighth read): the check that a text read
/// as a date names no time zone rule scanned the rest of a digit-free field
/// again at each of its words, so `1a-a-a-...` bound to `$1::timestamptz`
/// took minutes of a runtime thread for 900 KB, in host code no deadline
/// reaches. Two such calls held both of the host's worker threads, and
/// every other handler stopped. Now billing commits its orders meanwhile,
/// and each hostile event ends with PostgreSQL's own refusal of the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_date_parameter_holds_no_worker_thread_postgres() {
    let attack_topic = unique("zones");
    let order_topic = unique("orders");
    create_topic(&attack_topic, 4).await;
    create_topic(&order_topic, 1).await;
    let extra = format!(
        "[handlers.limits]\ntimeout_ms = 15000\n[handlers.retry]\nmax_attempts = 1\n\n{}",
        handler_block("billing", &order_topic)
    );
    let env = TestEnv::new(Backend::Postgres, "hostile", &attack_topic, &extra).await;
    // 900 KB: under the default row bound (1 MiB) and librdkafka's message
    // size; the old scan took about 1e11 steps on it.
    let text = format!("1{}", "a-".repeat(450_000));
    let attacks: Vec<Send> = (0..4)
        .map(|_| {
            let attack = json!({ "attack": "bind", "statement": "SELECT $1::timestamptz", "values": [text] });
            Send::json(&new_id(), attack)
        })
        .collect();
    let attack_ends = produce(&attack_topic, &attacks).await;
    let mut host = env.spawn_host_with(&[("TOKIO_WORKER_THREADS", "2")]);
    let db = env.db().await;

    let orders: Vec<Send> = (0..50)
        .map(|i| Send::order(&new_id(), &format!("o{i}")))
        .collect();
    let order_ends = produce(&order_topic, &orders).await;
    env.wait_for_offsets(&attack_ends, Duration::from_secs(60), &mut host)
        .await;
    let billing_done = poll_until(Duration::from_secs(60), || {
        let db = db.clone();
        let topic = order_topic.clone();
        let want = order_ends.clone();
        async move { polled_offsets(&db, "billing", &topic).await.ok() == Some(want) }
    })
    .await;
    assert!(billing_done, "billing never finished:\n{}", host.log());
    let invoices = db.handler_table("billing", "invoices");
    assert_eq!(count(&db, &format!("SELECT COUNT(*) FROM {invoices}")).await, 50);
    let letters = inboxd::db::dead_letters::list(&db, "hostile").await.unwrap();
    assert_eq!(letters.len(), attacks.len(), "{letters:#?}");
    for letter in &letters {
        assert!(
            letter.reason.contains("timestamp") || letter.reason.contains("time zone"),
            "{}",
            letter.reason
        );
    }
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}

/// Regression (issue 23, the forty-ninth read): one host call could make
/// the host copy as much of the guest as its memory held (512 MiB at the
/// team ceiling, aliased strings), on a runtime worker, before any bound
/// looked at it. Now a call carries at most what the handler's limits let a
/// statement or a publish carry (16 MiB at the defaults): 24 values of a
/// megabyte are refused as they are copied, with wasmtime's reason.
#[tokio::test]
async fn one_host_call_copies_at_most_what_the_limits_let_a_call_carry() {
    let topic = unique("big-params");
    create_topic(&topic, 1).await;
    let env = TestEnv::new(Backend::Sqlite, "hostile", &topic, "").await;
    let attack = json!({ "attack": "big-params", "statement": "SELECT 1", "count": 24, "bytes": 1_000_000 });
    let ends = produce(&topic, &[Send::json(&new_id(), attack)]).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(60), &mut host)
        .await;
    let db = env.db().await;
    let letters = inboxd::db::dead_letters::list(&db, "hostile").await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert!(
        letters[0]
            .reason
            .contains("too much data is being copied between the host and the guest"),
        "{}",
        letters[0].reason
    );
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}
