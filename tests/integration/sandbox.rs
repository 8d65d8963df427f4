//! The hostile-guest suite: every attack on deduplication is refused (a typed
//! error to the guest, which the hostile guest turns into a rejection) or
//! stopped by a limit, and afterwards the inbox, the offsets and another
//! handler's tables are exactly as they should be. Also: the second wall on
//! its own, with the statement guard out of the way.

use crate::on_both_backends;
use crate::support::*;
use inboxd::db::{Database, Tx, Walls, migrate};
use serde_json::{Value, json};
use std::time::Duration;

mod attacks;
mod log_lines;
mod worker_time;

use attacks::attacks;

on_both_backends!(hostile_guests_cannot_touch_dedup_and_the_host_stays_up);

async fn hostile_guests_cannot_touch_dedup_and_the_host_stays_up(backend: Backend) {
    let attack_topic = unique("attacks");
    let order_topic = unique("orders");
    create_topic(&attack_topic, 1).await;
    create_topic(&order_topic, 1).await;
    let billing = format!(
        r#"[handlers.limits]
timeout_ms = 1000
memory_mb = 32
max_statements = 50
max_rows = 100
max_statement_bytes = 2048
max_payload_bytes = 4096
output_bytes = 1024
[handlers.retry]
max_attempts = 1

{}"#,
        handler_block("billing", &order_topic)
    );
    let env = TestEnv::new(backend, "hostile", &attack_topic, &billing).await;

    let orders: Vec<Send> = (0..3).map(|i| Send::order(&new_id(), &format!("o{i}"))).collect();
    let order_ends = produce(&order_topic, &orders).await;

    let attacks = attacks(&brokers(), backend);
    let mut records: Vec<(String, Value)> = attacks
        .iter()
        .map(|(payload, _)| (new_id(), payload.clone()))
        .collect();
    let stdout_id = new_id();
    let ok_id = new_id();
    records.push((
        stdout_id.clone(),
        json!({ "attack": "stdout", "bytes": 5_000_000 }),
    ));
    records.push((ok_id.clone(), json!({ "attack": "ok" })));
    // A handler that handles a failed statement and goes on must see its
    // transaction still usable (PostgreSQL aborts it unless the host contains it).
    let recover_id = new_id();
    records.push((recover_id.clone(), json!({ "attack": "recover" })));
    let sends: Vec<Send> = records
        .iter()
        .map(|(id, payload)| Send::json(id, payload.clone()))
        .collect();
    let ends = produce(&attack_topic, &sends).await;

    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(240), &mut host)
        .await;
    assert!(
        host.is_running(),
        "the host survived every attack:\n{}",
        host.log()
    );

    let db = env.db().await;
    let letters = inboxd::db::dead_letters::list(&db, "hostile").await.unwrap();
    for ((id, payload), (_, expected)) in records.iter().zip(&attacks) {
        let letter = letters
            .iter()
            .find(|l| l.event_id.as_deref() == Some(id.as_str()));
        let letter = letter.unwrap_or_else(|| panic!("attack {payload} was not refused: no dead letter"));
        assert!(
            letter.reason.contains(expected),
            "attack {payload}: reason {:?} lacks {expected:?}",
            letter.reason
        );
        assert_ne!(
            letter.kind, "sandbox-violation",
            "the walls, not the last check, must stop {payload}"
        );
    }
    assert_eq!(
        letters.len(),
        attacks.len(),
        "only the attacks were dead-lettered"
    );

    // Megabytes of stdout cost only truncation: the event still applied.
    let mut tx = db.begin().await.unwrap();
    let status = inboxd::db::inbox::status(&mut tx, "hostile", &stdout_id)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(status.as_deref(), Some("done"));
    assert!(
        host.log()
            .contains("guest output past limits.output_bytes was dropped")
    );

    // Dedup is intact: one inbox row per record, offsets at the ends and each
    // committed once, the control event applied once, the neighbour untouched.
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM inbox WHERE handler = 'hostile'").await,
        records.len() as i64
    );
    env.assert_exactly_once("hostile_effects", 2, &ends).await;
    let effects = env.table("hostile_effects").await;
    let controls = rows(&db, &format!("SELECT event_id FROM {effects} ORDER BY event_id")).await;
    let mut expected = vec![ok_id, recover_id];
    expected.sort();
    let expected: Vec<_> = expected
        .into_iter()
        .map(|id| vec![inboxd::db::SqlValue::Text(id)])
        .collect();
    assert_eq!(
        controls, expected,
        "the control and the recovering handler applied once each"
    );
    let billing_done = poll_until(Duration::from_secs(60), || {
        let db = db.clone();
        let want: i64 = order_ends.values().sum();
        async move {
            let positions = inboxd::db::offsets::load_all(&db, "billing")
                .await
                .unwrap_or_default();
            positions.iter().map(|p| p.next_offset).sum::<i64>() == want
        }
    })
    .await;
    assert!(
        billing_done,
        "the billing handler never consumed its orders:\n{}",
        host.log()
    );
    let positions = inboxd::db::offsets::load_all(&db, "billing").await.unwrap();
    assert_eq!(
        positions
            .iter()
            .map(|p| (p.partition, p.next_offset))
            .collect::<std::collections::HashMap<_, _>>(),
        order_ends
    );
    let invoices = db.handler_table("billing", "invoices");
    assert_eq!(
        count(&db, &format!("SELECT COUNT(*) FROM {invoices}")).await,
        3,
        "another handler's rows are untouched"
    );
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}

// The second wall alone: statements the guard would refuse, sent straight
// to the database inside the handler's scope, are refused by the database.
on_both_backends!(the_database_refuses_what_the_guard_would);

async fn the_database_refuses_what_the_guard_would(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::connect(&database_url(backend, dir.path()).await, 2)
        .await
        .unwrap();
    db.migrate_host().await.unwrap();
    for handler in ["hostile", "billing"] {
        migrate::prepare_handler(&db, handler).await.unwrap();
        migrate::apply_handler(&db, handler, &guest_migrations(handler))
            .await
            .unwrap();
    }
    let mut statements = vec![
        "DELETE FROM inbox",
        "UPDATE offsets SET next_offset = 0",
        "SELECT * FROM dead_letters",
    ];
    match backend {
        Backend::Sqlite => statements.extend([
            "ATTACH DATABASE '/tmp/inboxd-wall.db' AS x",
            "PRAGMA writable_schema = ON",
            "CREATE TABLE sneaky (a TEXT)",
            "BEGIN",
        ]),
        Backend::Postgres => statements.extend([
            "DELETE FROM inboxd.inbox",
            "DELETE FROM handler_billing.invoices",
            // The session is the handler's own login (issue 23): a role
            // change is checked against it, and it is a member of nothing.
            "SET ROLE postgres",
            "SET SESSION AUTHORIZATION postgres",
            "SELECT set_config('role', 'postgres', true)",
            // Functions that run a query run it as the session's user.
            "SELECT ts_stat('SELECT to_tsvector(event_id) FROM inboxd.inbox')",
            "SELECT ('SELECT to_tsvector(event_id) FROM inboxd.inbox'::text).ts_stat",
            "SELECT * FROM ts_stat('SELECT to_tsvector(customer_email) FROM handler_billing.invoices')",
            // The host's gates, without the host's key.
            "SELECT inboxd_gate.unclaim('guessed', 'hostile', 'e1', 'done')",
            "SELECT inboxd_gate.advance_offset(NULL, 'hostile', 't', 0, 0, 0, 0, 7)",
            "SELECT pg_read_file('/etc/passwd')",
            "SELECT lo_import('/etc/passwd')",
            "CREATE TABLE inboxd.sneaky (a TEXT)",
        ]),
    }
    {
        let mut host: Tx = db.begin().await.unwrap();
        host.execute("INSERT INTO offsets (handler, topic, partition, next_offset, records_committed, updated_at) VALUES ('hostile', 't', 0, 7, 7, 0)", &[])
            .await
            .unwrap();
        host.commit().await.unwrap();
    }
    // PostgreSQL: on a session of the handler's own login, as the pipeline runs it.
    let mut tx: Tx = db.begin_guest("hostile").await.unwrap();
    let walls = Walls::load(&db, "hostile", Duration::from_secs(5)).await.unwrap();
    tx.enter_walls(&walls).await.unwrap();
    // What a session can do to its own role and settings, done: none of it
    // brings a host table or another handler's within reach.
    if backend == Backend::Postgres {
        for undo in [
            "RESET ROLE",
            "SET ROLE NONE",
            "SELECT set_config('role', 'none', true)",
            "SELECT set_config('search_path', 'handler_hostile, inboxd, handler_billing, public', false)",
        ] {
            tx.guest_execute(undo, &[]).await.unwrap();
            for probe in [
                "SELECT count(*) FROM inboxd.inbox",
                "SELECT count(*) FROM handler_billing.invoices",
            ] {
                let err = tx.guest_query(probe, &[], 10, 1 << 20).await.unwrap_err();
                assert!(
                    err.to_string().contains("permission denied"),
                    "after {undo}: {probe}: {err}"
                );
            }
        }
    }
    for statement in &statements {
        let refused = tx.guest_execute(statement, &[]).await;
        let message = refused
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| panic!("{backend:?} allowed {statement}"));
        assert!(
            // SQLite's authorizer says "not authorized" or "prohibited"; PostgreSQL's
            // role lacks privileges, and the host's schema is not on its search path.
            [
                "not authorized",
                "prohibited",
                "permission denied",
                "must be superuser",
                "does not exist",
                "only the host may"
            ]
            .iter()
            .any(|m| message.contains(m)),
            "{backend:?}: {statement}: {message}"
        );
    }
    // The handler's own table still works inside the same transaction.
    tx.guest_execute("INSERT INTO hostile_effects (event_id) VALUES ('fine')", &[])
        .await
        .unwrap();
    tx.leave_walls().await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        count(&db, "SELECT next_offset FROM offsets WHERE handler = 'hostile'").await,
        7
    );
}

// A handler whose statement never ends is stopped at its deadline, attempt
// after attempt, and parked; meanwhile another handler keeps committing.
on_both_backends!(an_endless_statement_does_not_stall_other_handlers);

async fn an_endless_statement_does_not_stall_other_handlers(backend: Backend) {
    let stuck_topic = unique("stuck");
    let order_topic = unique("orders");
    create_topic(&stuck_topic, 1).await;
    create_topic(&order_topic, 1).await;
    let extra = format!(
        "[handlers.limits]\ntimeout_ms = 1500\n[handlers.retry]\nmax_attempts = 3\nbackoff_initial_ms = 50\nbackoff_max_ms = 100\n\n{}",
        handler_block("billing", &order_topic)
    );
    let env = TestEnv::new(backend, "hostile", &stuck_topic, &extra).await;
    let endless = json!({ "attack": "query", "statement": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n" });
    let stuck: Vec<Send> = (0..3).map(|_| Send::json(&new_id(), endless.clone())).collect();
    let stuck_ends = produce(&stuck_topic, &stuck).await;
    let orders: Vec<Send> = (0..50)
        .map(|i| Send::order(&new_id(), &format!("o{i}")))
        .collect();
    let order_ends = produce(&order_topic, &orders).await;
    let mut host = env.spawn_host();
    let db = env.db().await;

    // 3 events x 3 attempts x 1.5 s: the stuck handler is busy for about 14 s.
    let billing_done = poll_until(Duration::from_secs(120), || {
        let db = db.clone();
        let topic = order_topic.clone();
        let want = order_ends.clone();
        async move { polled_offsets(&db, "billing", &topic).await.ok() == Some(want) }
    })
    .await;
    assert!(
        billing_done,
        "billing stalled behind the endless statement:\n{}",
        host.log()
    );
    let parked_meanwhile = inboxd::db::dead_letters::list(&db, "hostile")
        .await
        .unwrap()
        .len();
    assert!(
        parked_meanwhile < stuck.len(),
        "billing finished only after every endless statement was parked ({parked_meanwhile})"
    );
    let invoices = db.handler_table("billing", "invoices");
    assert_eq!(count(&db, &format!("SELECT COUNT(*) FROM {invoices}")).await, 50);

    env.wait_for_offsets(&stuck_ends, Duration::from_secs(120), &mut host)
        .await;
    let letters = inboxd::db::dead_letters::list(&db, "hostile").await.unwrap();
    assert_eq!(letters.len(), stuck.len(), "each endless event parked once");
    for letter in &letters {
        assert!(letter.reason.contains("limits.timeout_ms"), "{}", letter.reason);
        assert_eq!(letter.attempts, 3, "its time counted against its attempts");
    }
    assert!(host.is_running(), "{}", host.log());
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}

// A config file's handler whose migration tries to leave the walls: the
// host refuses to start, naming the file and the statement, and changed nothing.
on_both_backends!(a_hostile_config_migration_stops_the_start);

async fn a_hostile_config_migration_stops_the_start(backend: Backend) {
    let topic = unique("hostile-mig");
    create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        guest_migrations("hostile").join("0001_effects.sql"),
        dir.path().join("0001_effects.sql"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("0002_escape.sql"),
        "CREATE TABLE scratch (a TEXT);\nRESET ROLE;\nDELETE FROM inboxd.inbox;\nDROP TABLE handler_deployments;",
    )
    .unwrap();
    let extra = format!("migrations = \"{}\"\n", dir.path().display());
    let env = TestEnv::new(backend, "hostile", &topic, "").await;
    // The handler block names the guest's own migrations; point it at ours.
    let config = std::fs::read_to_string(&env.config_path).unwrap();
    let config = config.replace(
        &format!("migrations = \"{}\"\n", guest_migrations("hostile").display()),
        &extra,
    );
    std::fs::write(&env.config_path, config).unwrap();
    let mut host = env.spawn_host();
    let status = host
        .exited(Duration::from_secs(60))
        .await
        .expect("the host stops by itself");
    assert!(!status.success());
    let log = host.log();
    assert!(
        log.contains("0002_escape.sql") && log.contains("refused"),
        "{log}"
    );
    let db = env.db().await;
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM handler_deployments").await,
        0,
        "host table intact"
    );
    let scratch = db.handler_table("hostile", "scratch");
    assert!(db.query(&format!("SELECT * FROM {scratch}"), &[]).await.is_err());
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM handler_migrations WHERE handler = 'hostile'"
        )
        .await,
        1,
        "only the first migration applied"
    );
}

// Host tables are derived, not listed: every table a migrated database
// holds besides the handlers' own is out of a handler's reach through both
// walls, and its name is one a handler can never create. A host migration
// that adds a table outside the reserved names fails here.
on_both_backends!(every_host_table_is_behind_both_walls);

async fn every_host_table_is_behind_both_walls(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::connect(&database_url(backend, dir.path()).await, 2)
        .await
        .unwrap();
    db.migrate_host().await.unwrap();
    migrate::prepare_handler(&db, "hostile").await.unwrap();
    migrate::apply_handler(&db, "hostile", &guest_migrations("hostile"))
        .await
        .unwrap();
    let listed = match backend {
        Backend::Sqlite => {
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN \
             (SELECT table_name FROM handler_tables)"
        }
        Backend::Postgres => "SELECT tablename::text FROM pg_tables WHERE schemaname = 'inboxd'",
    };
    let tables: Vec<String> = rows(&db, listed)
        .await
        .into_iter()
        .filter_map(|r| r.first().and_then(|v| v.as_str()).map(str::to_owned))
        .collect();
    assert!(tables.len() >= 8, "{tables:?}");
    let guard = inboxd::sandbox::Guard::new(
        db.backend(),
        &migrate::own_schema(db.backend(), "hostile"),
        &["hostile_effects".to_owned()],
        4096,
        1 << 20,
    );
    let walls = Walls::load(&db, "hostile", Duration::from_secs(5)).await.unwrap();
    for table in &tables {
        assert!(
            inboxd::sandbox::is_reserved(table),
            "{table} is not under a reserved prefix"
        );
        let name = match backend {
            Backend::Sqlite => table.clone(),
            Backend::Postgres => format!("inboxd.{table}"),
        };
        for statement in [format!("SELECT * FROM {name}"), format!("DELETE FROM {name}")] {
            assert!(guard.check(&statement).is_err(), "the guard allowed {statement}");
            let mut tx: Tx = db.begin_guest("hostile").await.unwrap();
            tx.enter_walls(&walls).await.unwrap();
            let refused = tx.guest_execute(&statement, &[]).await;
            assert!(refused.is_err(), "the database allowed {statement}");
            tx.rollback().await.unwrap();
        }
    }
}

/// Regression: a guest's endless statement kept running inside PostgreSQL
/// for minutes after the host that sent it was killed, holding its locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_dies_at_its_deadline_even_when_the_host_is_killed() {
    let topic = unique("orphan");
    create_topic(&topic, 1).await;
    let env = TestEnv::new(
        Backend::Postgres,
        "hostile",
        &topic,
        "[handlers.limits]\ntimeout_ms = 3000\n",
    )
    .await;
    let marker = unique("marker").replace('-', "_");
    let statement = format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) /* {marker} */ FROM n"
    );
    produce(
        &topic,
        &[Send::json(
            &new_id(),
            json!({ "attack": "query", "statement": statement }),
        )],
    )
    .await;
    let mut host = env.spawn_host();
    let db = env.db().await;
    let running = format!(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%{marker}%' \
         AND query NOT LIKE '%pg_stat_activity%'"
    );
    let started = poll_until(Duration::from_secs(90), || {
        let (db, running) = (db.clone(), running.clone());
        async move { count(&db, &running).await > 0 }
    })
    .await;
    assert!(started, "the statement never ran:\n{}", host.log());
    host.kill();
    let killed_at = std::time::Instant::now();
    let gone = poll_until(Duration::from_secs(30), || {
        let (db, running) = (db.clone(), running.clone());
        async move { count(&db, &running).await == 0 }
    })
    .await;
    assert!(
        gone,
        "the statement outlived its host by {:?}",
        killed_at.elapsed()
    );
}

/// Regression (the eighth read of this round, issue 23): a guest in a loop
/// held one of tokio's worker threads for its whole timeout, and as many
/// looping guests as workers (partitions on PostgreSQL) held them all:
/// every other handler, the relay and the admin API stood still. Now a
/// running guest yields at every epoch tick, and billing commits while two
/// loops run on the host's two worker threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looping_guests_hold_no_worker_thread_postgres() {
    let loop_topic = unique("loops");
    let order_topic = unique("orders");
    create_topic(&loop_topic, 4).await;
    create_topic(&order_topic, 1).await;
    let extra = format!(
        "[handlers.limits]\ntimeout_ms = 15000\n[handlers.retry]\nmax_attempts = 1\n\n{}",
        handler_block("billing", &order_topic)
    );
    let env = TestEnv::new(Backend::Postgres, "hostile", &loop_topic, &extra).await;
    // Keyed by their random ids, so spread over the partitions.
    let loops: Vec<Send> = (0..8)
        .map(|_| Send::json(&new_id(), json!({ "attack": "loop" })))
        .collect();
    let loop_ends = produce(&loop_topic, &loops).await;
    let mut host = env.spawn_host_with(&[("TOKIO_WORKER_THREADS", "2")]);
    let db = env.db().await;
    // Two loops running at once: two of the handler's sessions wait in
    // their transactions while their guests spin.
    let role = inboxd::db::handler_role("hostile");
    let sessions = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}' AND state = 'idle in transaction'"
    );
    let spinning = poll_until(Duration::from_secs(60), || {
        let (db, sql) = (db.clone(), sessions.clone());
        async move { count(&db, &sql).await >= 2 }
    })
    .await;
    assert!(spinning, "two loops never ran at once:\n{}", host.log());

    let orders: Vec<Send> = (0..50)
        .map(|i| Send::order(&new_id(), &format!("o{i}")))
        .collect();
    let order_ends = produce(&order_topic, &orders).await;
    let billing_done = poll_until(Duration::from_secs(60), || {
        let db = db.clone();
        let topic = order_topic.clone();
        let want = order_ends.clone();
        async move { polled_offsets(&db, "billing", &topic).await.ok() == Some(want) }
    })
    .await;
    assert!(billing_done, "billing never finished:\n{}", host.log());
    let parked_meanwhile = inboxd::db::dead_letters::list(&db, "hostile")
        .await
        .unwrap()
        .len();
    assert_eq!(
        parked_meanwhile, 0,
        "billing finished only once the first loops were stopped at their 15 s deadline"
    );
    env.wait_for_offsets(&loop_ends, Duration::from_secs(180), &mut host)
        .await;
    let letters = inboxd::db::dead_letters::list(&db, "hostile").await.unwrap();
    assert_eq!(letters.len(), loops.len());
    for letter in &letters {
        assert!(letter.reason.contains("limits.timeout_ms"), "{}", letter.reason);
    }
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}

/// Regression (the eleventh read of this round, issue 23): a stop (here the
/// host's shutdown; a pause, a delete and a restart take the same path)
/// waited for the pump's whole batch, since a batch looked at its stop only
/// in retry backoffs: 1,000 looping events of a 30 s deadline, one per
/// transaction after the batch wall, were hours of a pause or a shutdown,
/// and the registry (every team's uploads and activations) waited with it.
/// Now a batch ends after the transaction it is in, and the rest of the
/// partition is run by the next host, each event once.
#[tokio::test]
async fn a_stop_ends_a_batch_of_slow_events_after_its_transaction() {
    let topic = unique("slow-stop");
    create_topic(&topic, 1).await;
    let extra = "[handlers.limits]\ntimeout_ms = 2000\n[handlers.retry]\nmax_attempts = 1\n";
    let env = TestEnv::new(Backend::Sqlite, "hostile", &topic, extra).await;
    let loops: Vec<Send> = (0..10)
        .map(|_| Send::json(&new_id(), json!({ "attack": "loop" })))
        .collect();
    let ends = produce(&topic, &loops).await;
    let mut host = env.spawn_host();
    let db = env.db().await;
    // The first loop was stopped at its deadline and parked: the batch is
    // in its next transaction, with eight more events of 2 s behind it.
    let first = poll_until(Duration::from_secs(60), || {
        let db = db.clone();
        async move {
            // The host may not have made its tables yet.
            inboxd::db::dead_letters::list(&db, "hostile")
                .await
                .is_ok_and(|letters| !letters.is_empty())
        }
    })
    .await;
    assert!(first, "no loop was ever stopped:\n{}", host.log());
    let asked = std::time::Instant::now();
    assert_eq!(
        host.terminate(Duration::from_secs(60)).await,
        Some(0),
        "{}",
        host.log()
    );
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the shutdown waited {took:?} (the batch's eight other loops are 16 s)"
    );
    // The next host runs what the first left, and each event ends once.
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    let letters = inboxd::db::dead_letters::list(&db, "hostile").await.unwrap();
    let ids: std::collections::HashSet<_> = letters.iter().map(|l| l.event_id.clone()).collect();
    assert_eq!((letters.len(), ids.len()), (loops.len(), loops.len()));
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}
