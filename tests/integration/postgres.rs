//! PostgreSQL-only behaviour: the server restarting mid-stream, a host
//! started while it is down, and two hosts sharing one consumer group and
//! one database.

use crate::support::*;
use std::time::Duration;

/// What the host logs, once, when the database goes away.
const OUTAGE_LINE: &str = "retrying with backoff until it succeeds";

/// Regression: a restart must cost a pause and one log line per outage, never a
/// skipped record, a doubled one, or a dead letter for a healthy event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_stream_pauses_and_resumes_exactly_once() {
    let cluster = PgCluster::start();
    let topic = unique("orders");
    create_topic(&topic, 3).await;
    let db_url = create_postgres_database(&cluster.admin_url).await;
    let env = TestEnv::with_database(tempfile::tempdir().unwrap(), db_url, "billing", &topic, "");
    let initial = 3_000;
    let mut ends = produce(&topic, &orders_with_duplicates(initial, 5)).await;

    let mut host = env.spawn_host();
    let started = wait_for_progress(&env, &topic, 100).await;
    assert!(started, "no progress before the restart:\n{}", host.log());
    // Orders keep arriving through the outage, so the host is mid-stream
    // when the database goes, however fast it is.
    let trickle = Trickle::start(&topic);
    // Stop, and start again only once the host has met the outage: a plain
    // `pg_ctl restart` can fall between two transactions, where the pool
    // silently reconnects and the outage path is never exercised.
    cluster.stop();
    let noticed = poll_until(Duration::from_secs(60), || async {
        host.log().contains(OUTAGE_LINE)
    })
    .await;
    cluster.start_again();
    assert!(noticed, "the host never reported the outage:\n{}", host.log());
    let resumed = progresses_by(&env, &topic, 500).await;
    assert!(resumed, "no progress after the restart:\n{}", host.log());
    let unique_events = initial + trickle.stop(&mut ends).await;

    env.wait_for_offsets(&ends, Duration::from_secs(180), &mut host)
        .await;
    assert!(host.is_running(), "the host must survive a database restart");
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
    env.assert_exactly_once("invoices", unique_events, &ends).await;
    let db = env.db().await;
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM dead_letters").await,
        0,
        "no healthy event dead-lettered"
    );

    let log = host.log();
    let outage_lines = log.lines().filter(|l| l.contains(OUTAGE_LINE)).count();
    assert!(
        (1..=2).contains(&outage_lines),
        "expected one outage line (two at most), got {outage_lines}:\n{log}"
    );
    assert!(log.contains("database is back"), "the recovery is logged:\n{log}");
}

/// Regression (found by the chaos test's network cut): a host started while
/// PostgreSQL could not be reached exited at once; it waits for it now (up
/// to a minute), then applies everything once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_started_while_postgres_is_down_waits_for_it() {
    let cluster = PgCluster::start();
    let topic = unique("orders");
    create_topic(&topic, 2).await;
    let db_url = create_postgres_database(&cluster.admin_url).await;
    let env = TestEnv::with_database(tempfile::tempdir().unwrap(), db_url, "billing", &topic, "");
    let ends = produce(&topic, &orders_with_duplicates(50, 5)).await;
    cluster.stop();
    let mut host = env.spawn_host();
    let waiting = poll_until(Duration::from_secs(30), || async {
        host.log().contains("retrying for up to")
    })
    .await;
    assert!(
        waiting,
        "the host never said it waits for the database:\n{}",
        host.log()
    );
    assert!(host.is_running(), "the host exited:\n{}", host.log());
    cluster.start_again();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
    env.assert_exactly_once("invoices", 50, &ends).await;
}

/// Two hosts in one group: partitions split, a rebalance happens while both
/// process, and every offset range is committed by exactly one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_in_one_group_split_partitions_and_stay_exactly_once() {
    let topic = unique("orders");
    create_topic(&topic, 4).await;
    let env = TestEnv::new(Backend::Postgres, "billing", &topic, "").await;
    let initial = 3_000;
    let mut ends = produce(&topic, &orders_with_duplicates(initial, 5)).await;

    let mut first = env.spawn_host();
    let started = wait_for_progress(&env, &topic, 100).await;
    assert!(
        started,
        "no progress before the second host joined:\n{}",
        first.log()
    );
    // Orders keep arriving until well after the second host is in, so the
    // rebalance happens mid-stream however fast the first host is.
    let trickle = Trickle::start(&topic);
    let mut second = env.spawn_host();
    let joined = poll_until(Duration::from_secs(60), || {
        let log = second.log();
        async move {
            log.lines()
                .any(|l| l.contains("partitions assigned") && !l.contains("partitions=[]"))
        }
    })
    .await;
    assert!(joined, "the second host never got partitions:\n{}", second.log());
    let after_join = progresses_by(&env, &topic, 500).await;
    assert!(after_join, "no progress after the rebalance:\n{}", second.log());
    let trickled = trickle.stop(&mut ends).await;
    assert!(trickled > 0, "orders arrived during the rebalance");

    env.wait_for_offsets(&ends, Duration::from_secs(240), &mut first)
        .await;
    assert!(
        first.log().contains("partitions revoked"),
        "the first host gave partitions up:\n{}",
        first.log()
    );
    assert!(second.is_running() && first.is_running());
    assert_eq!(first.terminate(Duration::from_secs(30)).await, Some(0));
    assert_eq!(second.terminate(Duration::from_secs(30)).await, Some(0));
    env.assert_exactly_once("invoices", initial + trickled, &ends)
        .await;
}
