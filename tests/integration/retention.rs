//! Inbox retention: `inboxd purge` deletes only rows past the cutoff (both
//! backends), and PostgreSQL's daily partitions keep dedup exact across a day
//! boundary and are dropped whole.

use crate::on_both_backends;
use crate::support::*;
use inboxd::db::{SqlValue, now_ms};
use std::process::Command;
use std::time::Duration;

const DAY_MS: i64 = 86_400_000;

fn inboxd(env: &TestEnv, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_inboxd"))
        .args(args)
        .arg("--config")
        .arg(&env.config_path)
        .output()
        .expect("run inboxd");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "inboxd {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

on_both_backends!(purge_deletes_rows_past_the_cutoff_and_keeps_the_rest);

async fn purge_deletes_rows_past_the_cutoff_and_keeps_the_rest(backend: Backend) {
    let env = TestEnv::new(backend, "billing", "unused", "").await;
    inboxd(&env, &["migrate"]);
    let db = env.db().await;
    let old = now_ms() - 20 * DAY_MS;
    let mut tx = db.begin().await.unwrap();
    for i in 0..2_500 {
        let processed_at = if i % 5 == 0 { now_ms() } else { old };
        tx.execute(
            r#"INSERT INTO inbox (handler, event_id, status, topic, partition, "offset", handler_version, processed_at, id_day)
               VALUES ('billing', $1, 'done', 't', 0, $2, 'v', $3, 0)"#,
            &[new_id().into(), SqlValue::Int64(i), processed_at.into()],
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();

    let dry = inboxd(&env, &["purge", "--older-than", "14d", "--dry-run"]);
    assert!(dry.contains("would delete 2000 inbox rows"), "{dry}");
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM inbox").await,
        2_500,
        "a dry run deletes nothing"
    );

    let out = inboxd(&env, &["purge", "--older-than", "14d", "--batch-size", "300"]);
    assert!(out.contains("deleted 2000 inbox rows"), "{out}");
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM inbox").await,
        500,
        "rows within retention stay"
    );
    assert_eq!(
        count(
            &db,
            &format!(
                "SELECT COUNT(*) FROM inbox WHERE processed_at < {}",
                now_ms() - DAY_MS
            )
        )
        .await,
        0
    );
}

fn v7_at(ms: i64) -> String {
    let ts = uuid::Timestamp::from_unix(
        uuid::NoContext,
        (ms / 1000) as u64,
        ((ms % 1000) * 1_000_000) as u32,
    );
    uuid::Uuid::new_v7(ts).to_string()
}

async fn partition_of(env: &TestEnv, event_id: &str) -> String {
    let db = env.db().await;
    let rows = db
        .query(
            "SELECT tableoid::regclass::text FROM inbox WHERE event_id = $1",
            &[event_id.into()],
        )
        .await
        .unwrap();
    match rows.as_slice() {
        [row] => row[0].as_str().unwrap().rsplit('.').next().unwrap().to_owned(),
        other => panic!("expected one inbox row for {event_id}, got {other:?}"),
    }
}

/// Regression for partitioned dedup: the unique key includes the partition
/// column, so a copy routed to another partition would not conflict. Routing by
/// a pure function of the id keeps every copy in the original's partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daily_partitions_keep_dedup_exact_across_a_day_boundary() {
    let topic = unique("orders");
    create_topic(&topic, 2).await;
    let env = TestEnv::new(
        Backend::Postgres,
        "billing",
        &topic,
        "[inbox]\npartitioning = \"daily\"",
    )
    .await;
    let today = now_ms() / DAY_MS;
    let before_midnight = v7_at(today * DAY_MS - 1);
    let after_midnight = v7_at(today * DAY_MS);
    let long_ago = v7_at(now_ms() - 40 * DAY_MS);
    let not_v7 = new_id();
    let ids = [&before_midnight, &after_midnight, &long_ago, &not_v7];
    let originals: Vec<Send> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| Send::order(id, &format!("o{i}")))
        .collect();
    let ends = produce(&topic, &originals).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;

    assert_eq!(
        partition_of(&env, &before_midnight).await,
        format!("inbox_d{}", today - 1)
    );
    assert_eq!(
        partition_of(&env, &after_midnight).await,
        format!("inbox_d{today}")
    );
    assert_eq!(partition_of(&env, &long_ago).await, "inbox_default");
    assert_eq!(partition_of(&env, &not_v7).await, "inbox_default");

    // A purge within retention keeps both days' partitions, and copies arriving
    // now (after the boundary) still find their originals and are skipped.
    let out = inboxd(&env, &["purge", "--older-than", "14d"]);
    assert!(out.contains("(0 whole partitions)"), "{out}");
    let copies: Vec<Send> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| Send::order(id, &format!("o{i}")))
        .collect();
    let ends = produce(&topic, &copies).await;
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    let invoices = env.table("invoices").await;
    let db = env.db().await;
    assert_eq!(
        count(&db, &format!("SELECT COUNT(*) FROM {invoices}")).await,
        4,
        "every copy was skipped"
    );

    // Past the cutoff (here: now), yesterday's partition goes whole and today's stays.
    let out = inboxd(&env, &["purge", "--older-than", "0s"]);
    assert!(out.contains("(1 whole partitions)"), "{out}");
    let partitions: Vec<String> = inboxd::db::partitions::list_daily(&db)
        .await
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(
        !partitions.contains(&format!("inbox_d{}", today - 1)),
        "{partitions:?}"
    );
    assert!(partitions.contains(&format!("inbox_d{today}")), "{partitions:?}");
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}
