//! Business-key dedup (`[handlers.dedup]`): two event ids with one order id
//! apply once inside the window, and again once the window has passed; a
//! parked or retried event holds no key; an event without the key is
//! deduplicated by its event id alone.

use crate::on_both_backends;
use crate::support::*;
use inboxd::db::SqlValue;
use serde_json::json;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// Short, so the test can step outside it.
const WINDOW_SECS: u64 = 3;

fn order(event_id: &str, order_id: Option<&str>, attack: serde_json::Value) -> Send {
    let mut body = json!({ "attack": "until", "attempt": 1 });
    if let serde_json::Value::Object(extra) = attack {
        for (name, value) in extra {
            body[name] = value;
        }
    }
    if let Some(order_id) = order_id {
        body["order_id"] = order_id.into();
    }
    Send::json(event_id, body)
}

on_both_backends!(events_with_one_business_key_apply_once_inside_the_window);

async fn events_with_one_business_key_apply_once_inside_the_window(backend: Backend) {
    let topic = unique("dedup");
    // One partition: which of two events with one key comes first is the
    // order they were sent in (records are keyed by event id).
    create_topic(&topic, 1).await;
    let settings = format!(
        "[handlers.retry]\nmax_attempts = 2\nbackoff_initial_ms = 10\nbackoff_max_ms = 20\n\
         [handlers.dedup]\nkey = \"$.order_id\"\nwindow = \"{WINDOW_SECS}s\""
    );
    let env = TestEnv::new(backend, "hostile", &topic, &settings).await;
    let ids: Vec<String> = (0..9).map(|_| new_id()).collect();
    let none = json!({});
    let records = vec![
        // One order under two event ids, and the first id sent again.
        order(&ids[0], Some("o-1"), none.clone()),
        order(&ids[1], Some("o-1"), none.clone()),
        order(&ids[0], Some("o-1"), none.clone()),
        order(&ids[2], Some("o-2"), none.clone()),
        // No business key: its event id alone dedups it.
        order(&ids[3], None, none.clone()),
        order(&ids[3], None, none.clone()),
        // Rejected and parked: it holds no key, so the next o-3 applies.
        order(&ids[4], Some("o-3"), json!({ "attack": "reject" })),
        order(&ids[5], Some("o-3"), none.clone()),
        // Retried once (its key released meanwhile), then applied; its
        // second id is a duplicate by key.
        order(&ids[6], Some("o-4"), json!({ "attempt": 2 })),
        order(&ids[7], Some("o-4"), none.clone()),
    ];
    let mut ends = produce(&topic, &records).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;

    let db = env.db().await;
    let effects = env.table("hostile_effects").await;
    let applied = |db: inboxd::db::Database, effects: String| async move {
        let mut ids: Vec<String> = rows(&db, &format!("SELECT event_id FROM {effects}"))
            .await
            .into_iter()
            .map(|row| match &row[0] {
                SqlValue::Text(id) => id.clone(),
                other => panic!("an event id, not {other:?}"),
            })
            .collect();
        ids.sort();
        ids
    };
    let mut expected: Vec<String> = [0, 2, 3, 5, 6].iter().map(|&i| ids[i].clone()).collect();
    expected.sort();
    assert_eq!(
        applied(db.clone(), effects.clone()).await,
        expected,
        "one effect per order id (and per event without one)"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM dead_letters").await,
        1,
        "only the rejected event is parked"
    );
    // The skipped ids are claimed: a redelivery of one is a plain duplicate.
    assert_eq!(
        count(
            &db,
            &format!(
                "SELECT COUNT(*) FROM inbox WHERE status = 'done' AND event_id IN ('{}', '{}')",
                ids[1], ids[7]
            )
        )
        .await,
        2
    );

    // Replaying the rejected o-3: ids[5] holds o-3 now, so it is resolved
    // without running (its effect is there), and nothing is applied twice.
    let letter = rows(&db, "SELECT id FROM dead_letters").await[0][0]
        .as_i64()
        .expect("id");
    let replayed = std::process::Command::new(env!("CARGO_BIN_EXE_inboxd"))
        .args(["dlq", "replay", &letter.to_string(), "--json", "--config"])
        .arg(&env.config_path)
        .output()
        .expect("run inboxd dlq replay");
    let said: serde_json::Value = serde_json::from_slice(&replayed.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&replayed.stderr)));
    assert_eq!(said[0]["outcome"], "duplicate-by-key", "{said}");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM dead_letters WHERE resolution = 'replayed'"
        )
        .await,
        1
    );
    assert_eq!(applied(db.clone(), effects.clone()).await, expected);

    // Past the window, the same order id under a new event id applies again.
    // (The window is what is being tested, so the test waits for it to end.)
    let expires_at = rows(
        &db,
        "SELECT expires_at FROM inbox_business_keys WHERE business_key = 'k:o-1'",
    )
    .await[0][0]
        .as_i64()
        .expect("o-1 is held");
    let deadline = Instant::now() + Duration::from_secs(WINDOW_SECS + 30);
    while now_ms() <= expires_at {
        assert!(Instant::now() < deadline, "o-1's window never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    merge_ends(
        &mut ends,
        produce(&topic, &[order(&ids[8], Some("o-1"), none.clone())]).await,
    );
    env.wait_for_offsets(&ends, Duration::from_secs(60), &mut host)
        .await;
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
    expected.push(ids[8].clone());
    expected.sort();
    assert_eq!(applied(db.clone(), effects.clone()).await, expected);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM inbox_business_keys WHERE business_key = 'k:o-1'"
        )
        .await,
        1
    );
}

/// A bad `[handlers.dedup]` is refused at start with the key that is wrong.
#[tokio::test]
async fn a_dedup_section_without_a_key_or_with_a_bad_path_is_refused_by_name() {
    for (settings, problem) in [
        ("[handlers.dedup]\nwindow = \"1h\"", "handlers[0].dedup"),
        (
            "[handlers.dedup]\nkey = \"order_id\"\nwindow = \"1h\"",
            "handlers[0].dedup.key",
        ),
        (
            "[handlers.dedup]\nkey = \"$.order_id\"\nwindow = \"0s\"",
            "handlers[0].dedup.window",
        ),
    ] {
        let topic = unique("dedupcfg");
        let env = TestEnv::new(Backend::Sqlite, "hostile", &topic, settings).await;
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_inboxd"))
            .args(["migrate", "--config"])
            .arg(&env.config_path)
            .output()
            .expect("run inboxd migrate");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{settings}: {stderr}");
        assert!(stderr.contains(problem), "{settings}: {stderr}");
    }
}

on_both_backends!(one_order_sent_under_many_event_ids_to_many_partitions_applies_once);

/// Each of 150 orders is sent under three event ids, keyed so the copies
/// land in different partitions, whose batches run at once: exactly one
/// effect per order, whichever partition wins, and no batch waits on another
/// for good (keys are claimed in key order).
async fn one_order_sent_under_many_event_ids_to_many_partitions_applies_once(backend: Backend) {
    let topic = unique("dedupmany");
    create_topic(&topic, 3).await;
    let settings = "[handlers.dedup]\nkey = \"$.order_id\"\nwindow = \"1h\"";
    let env = TestEnv::new(backend, "hostile", &topic, settings).await;
    let orders = 150;
    let mut records = Vec::new();
    for copy in 0..3 {
        for n in 0..orders {
            let mut record = order(&new_id(), Some(&format!("order-{n}")), json!({}));
            // Copies of an order go to different partitions.
            record.key = format!("{n}-{copy}");
            records.push(record);
        }
    }
    let ends = produce(&topic, &records).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
    let db = env.db().await;
    let effects = env.table("hostile_effects").await;
    assert_eq!(
        count(&db, &format!("SELECT COUNT(*) FROM {effects}")).await,
        orders,
        "one effect per order id"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM inbox_business_keys").await,
        orders
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM inbox WHERE status = 'done'").await,
        3 * orders,
        "every event id is claimed"
    );
    assert_eq!(count(&db, "SELECT COUNT(*) FROM dead_letters").await, 0);
}
