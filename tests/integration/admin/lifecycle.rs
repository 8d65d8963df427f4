//! Deploy, hot swap mid-stream, roll back, pause and resume on both
//! backends; then exactly once, the version on every inbox row, dead letters
//! over HTTP and `/metrics` against the database.

use super::*;
use serde_json::json;
use std::collections::HashMap;

/// The value of one series in Prometheus text, e.g. `inboxd_events_applied_total{handler="billing"}`.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Per partition, the handler versions of its inbox rows in offset order,
/// with repeats collapsed: `["1", "2", "1"]` is v1, then v2, then v1 again.
async fn version_runs(db: &inboxd::db::Database) -> HashMap<i64, Vec<String>> {
    let rows = rows(
        db,
        "SELECT partition, handler_version FROM inbox WHERE handler = 'billing' AND status = 'done' \
         ORDER BY partition, \"offset\"",
    )
    .await;
    let mut runs: HashMap<i64, Vec<String>> = HashMap::new();
    for row in rows {
        let partition = row[0].as_i64().expect("partition");
        let version = row[1].as_str().expect("version").to_owned();
        let run = runs.entry(partition).or_default();
        if run.last() != Some(&version) {
            run.push(version);
        }
    }
    runs
}

async fn hot_swap_and_rollback(backend: Backend) {
    let topic = unique("admin");
    create_topic(&topic, 2).await;
    let mut admin = start(backend, &topic, "").await;
    let billing = std::fs::read(guest_wasm("billing")).expect("billing.wasm");
    let settings = admin.env.dir.path().join("billing.json");
    let group = team_group("billing");
    std::fs::write(
        &settings,
        json!({ "group_id": group, "batch": { "max_events": 20 }, "outbox_topics": billing_outbox() })
            .to_string(),
    )
    .unwrap();

    // Version 1 through the CLI.
    let wasm = guest_wasm("billing");
    let migrations = guest_migrations("billing");
    let deployed = admin
        .cli(
            &[
                "deploy",
                wasm.to_str().unwrap(),
                "--name",
                "billing",
                "--topic",
                &topic,
                "--migrations",
                migrations.to_str().unwrap(),
                "--settings",
                settings.to_str().unwrap(),
            ],
            BILLING_TOKEN,
        )
        .await;
    assert!(
        deployed.status.success(),
        "deploy failed: {}\n--- host log ---\n{}",
        String::from_utf8_lossy(&deployed.stderr),
        admin.host.log()
    );
    assert!(String::from_utf8_lossy(&deployed.stdout).contains("billing version 1 uploaded and active"));

    // Phase A on version 1, with three records that have no event id.
    let mut records = orders_with_duplicates(200, 5);
    let mut unique_events = 200;
    for i in 0..3 {
        records.push(Send {
            key: format!("no-id-{i}"),
            event_id_header: None,
            payload: br#"{"order_id": "x"}"#.to_vec(),
            traceparent: None,
        });
    }
    let mut total_records = records.len();
    let mut ends = produce(&topic, &records).await;
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;

    // Version 2 while orders keep arriving.
    let trickle = Trickle::start(&topic);
    let db = admin.env.db().await;
    let at_upload: i64 = stored_offsets(&db, "billing", &topic).await.values().sum();
    let moved = wait_for_progress(&admin.env, &topic, at_upload + 200).await;
    assert!(moved, "no progress before the upload:\n{}", admin.host.log());
    let (status, body) = admin
        .upload(
            "billing",
            rebuilt(&billing, "v2"),
            // Other batching: the consumer is replaced, not just the code
            // (its batches in flight commit first).
            json!({ "topics": [topic], "group_id": group, "batch": { "max_events": 10 }, "outbox_topics": billing_outbox() }),
            // The same migrations again, as a redeploy sends them: read
            // (checksums) while the pipeline commits around them.
            Some(&migrations),
            BILLING_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["uploaded"]["version"], 2, "{body}");
    assert_eq!(body["handler"]["running"]["version"], "2", "{body}");
    assert!(
        logged(
            &admin.host,
            "handler version activated",
            &[("to", json!(2)), ("restart", json!(true))]
        ),
        "the new batching restarted the consumer:\n{}",
        admin.host.log()
    );
    let trickled = trickle.stop(&mut ends).await;
    unique_events += trickled;
    total_records += trickled + trickled / 5;
    // Phase B: only version 2 can have applied these.
    let records = orders_with_duplicates(100, 5);
    total_records += records.len();
    unique_events += 100;
    merge_ends(&mut ends, produce(&topic, &records).await);
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;

    // Roll back through the CLI; phase C runs on version 1 again.
    let rolled = admin.cli(&["rollback", "billing"], BILLING_TOKEN).await;
    assert!(
        rolled.status.success(),
        "{}",
        String::from_utf8_lossy(&rolled.stderr)
    );
    assert!(
        String::from_utf8_lossy(&rolled.stdout).contains("active version 1"),
        "{}",
        String::from_utf8_lossy(&rolled.stdout)
    );
    let records = orders_with_duplicates(100, 5);
    total_records += records.len();
    unique_events += 100;
    merge_ends(&mut ends, produce(&topic, &records).await);
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;

    // Pause: nothing moves while paused; resume picks up what arrived.
    // The consumer's lag series go with it (the fifteenth read: they
    // stayed for the host's life, one per partition a version ever had).
    let lag = r#"inboxd_consumer_lag{handler="billing""#;
    let reported = poll_until(Duration::from_secs(30), || async {
        admin.metrics().await.contains(lag)
    })
    .await;
    assert!(reported, "no lag series before the pause");
    let (status, body) = admin.post("/v1/handlers/billing/pause", BILLING_TOKEN).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["running"]["consuming"], false, "{body}");
    let metrics = admin.metrics().await;
    assert!(!metrics.contains(lag), "{metrics}");
    let paused_at = stored_offsets(&db, "billing", &topic).await;
    let records = orders_with_duplicates(50, 5);
    total_records += records.len();
    unique_events += 50;
    merge_ends(&mut ends, produce(&topic, &records).await);
    let moved = poll_until(Duration::from_secs(3), || {
        let (db, topic, paused_at) = (db.clone(), topic.clone(), paused_at.clone());
        async move { stored_offsets(&db, "billing", &topic).await != paused_at }
    })
    .await;
    assert!(!moved, "a paused handler committed records");
    let (status, body) = admin.post("/v1/handlers/billing/resume", BILLING_TOKEN).await;
    assert_eq!(status, 200, "{body}");
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;

    // Exactly once across both versions, and the version on every inbox row.
    admin
        .env
        .assert_exactly_once("invoices", unique_events, &ends)
        .await;
    let runs = version_runs(&db).await;
    assert_eq!(runs.len(), 2, "both partitions have rows: {runs:?}");
    for (partition, run) in &runs {
        assert_eq!(
            run,
            &["1", "2", "1"],
            "partition {partition}: versions in offset order"
        );
    }

    // The CLI's list agrees.
    let listed = admin.cli(&["handlers", "--json"], BILLING_TOKEN).await;
    assert!(listed.status.success());
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("handlers --json");
    assert_eq!(listed[0]["name"], "billing");
    assert_eq!(listed[0]["deployment"]["active_version"], 1);
    assert_eq!(listed[0]["versions"].as_array().map(Vec::len), Some(2));

    // Dead letters over HTTP, scoped by token.
    let (status, letters) = admin.get("/v1/dead-letters", Some(BILLING_TOKEN)).await;
    assert_eq!(status, 200);
    assert_eq!(letters.as_array().map(Vec::len), Some(3), "{letters}");
    let (status, hidden) = admin.get("/v1/dead-letters", Some(NOTIFY_TOKEN)).await;
    assert_eq!((status, hidden), (200, json!([])));
    let id = letters[0]["id"].as_i64().expect("id");
    // Another team's dead letter is not found, as if it did not exist.
    let (status, body) = admin
        .get(&format!("/v1/dead-letters/{id}"), Some(NOTIFY_TOKEN))
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(!body.to_string().contains("billing"), "{body}");
    let (status, _) = admin
        .post(&format!("/v1/dead-letters/{id}/discard"), NOTIFY_TOKEN)
        .await;
    assert_eq!(status, 404);
    let (status, shown) = admin
        .get(&format!("/v1/dead-letters/{id}"), Some(BILLING_TOKEN))
        .await;
    assert_eq!(status, 200);
    assert_eq!(shown["kind"], "event-id", "{shown}");
    let replay_all = |token: &'static str, page: serde_json::Value| {
        admin.call(
            admin
                .http
                .post(format!("{}/v1/dead-letters/replay", admin.url))
                .json(&page),
            Some(token),
        )
    };
    assert_eq!(
        replay_all(NOTIFY_TOKEN, json!({ "handler": "billing" })).await.0,
        403
    );
    let (status, answer) = replay_all(BILLING_TOKEN, json!({ "handler": "billing", "limit": 0 })).await;
    assert_eq!(status, 400, "{answer}");
    // In pages: the answer names where the next one starts, null at the end.
    let (mut outcomes, mut after) = (Vec::new(), serde_json::Value::Null);
    for expected in [Some(2), None] {
        let page = json!({ "handler": "billing", "limit": 2, "after_id": after });
        let (status, answer) = replay_all(BILLING_TOKEN, page).await;
        assert_eq!(status, 200, "{answer}");
        let listed = answer["outcomes"].as_array().unwrap();
        outcomes.extend(listed.iter().map(|o| o["outcome"].as_str().unwrap().to_owned()));
        after = answer["next_after_id"].clone();
        match expected {
            Some(n) => {
                assert_eq!(listed.len(), n, "{answer}");
                assert_eq!(after, listed[n - 1]["id"], "{answer}");
            }
            None => assert!(after.is_null(), "{answer}"),
        }
    }
    assert_eq!(
        outcomes, ["no-event-id"; 3],
        "dead letters without an event id are never run"
    );

    // /metrics matches the database.
    let text = admin.metrics().await;
    let applied = count(
        &db,
        "SELECT COUNT(*) FROM inbox WHERE handler = 'billing' AND status = 'done'",
    )
    .await;
    let dead = count(&db, "SELECT COUNT(*) FROM dead_letters WHERE handler = 'billing'").await;
    assert_eq!(applied, unique_events as i64);
    let billing_series = |name: &str| series(&text, &format!("inboxd_{name}{{handler=\"billing\"}}"));
    assert_eq!(
        billing_series("events_applied_total"),
        Some(applied as f64),
        "{text}"
    );
    assert_eq!(billing_series("dead_lettered_total"), Some(dead as f64), "{text}");
    assert_eq!(billing_series("dead_letters_parked"), Some(3.0), "{text}");
    assert_eq!(
        billing_series("duplicates_skipped_total"),
        Some((total_records - unique_events - 3) as f64),
        "{text}"
    );
    assert!(
        billing_series("events_consumed_total").is_some_and(|n| n >= total_records as f64),
        "{text}"
    );
    assert_eq!(
        billing_series("guest_duration_seconds_count"),
        Some(applied as f64),
        "{text}"
    );
    assert!(
        billing_series("batch_duration_seconds_count").is_some_and(|n| n > 0.0),
        "{text}"
    );
    assert!(billing_series("outbox_backlog").is_some(), "{text}");

    let (status, health) = admin.get("/healthz", None).await;
    assert_eq!(status, 200, "{health}");
    let (status, ready) = admin.get("/readyz", None).await;
    assert_eq!((status, &ready["ready"]), (200, &json!(true)), "{ready}");
    assert_eq!(admin.host.terminate(Duration::from_secs(30)).await, Some(0));
    // Guest log lines and everything else never show a token.
    let log = admin.host.log();
    for secret in [OPS_TOKEN, BILLING_TOKEN, NOTIFY_TOKEN] {
        assert!(!log.contains(secret), "a token was logged");
    }
}

crate::on_both_backends!(hot_swap_and_rollback);
