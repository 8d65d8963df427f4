//! Upgrades (issue 27): a database an earlier release wrote, with events in
//! flight, is migrated by this build, which goes on exactly once.
//!
//! `tests/fixtures/upgrade/<release>/` holds what one release wrote with
//! [`write_fixture`]: a SQLite file, a PostgreSQL dump, and `manifest.json`
//! (the records the release was sent, in order, and what they came to). In
//! each database: orders applied by version 1 of billing, uploaded through
//! the API, whose outbox messages are parked (mapped to an invalid topic);
//! orders it rejected (dead letters); version 2 uploaded and active; and
//! orders applied by version 2 on a host that died as its relay was about to
//! publish (outbox messages pending). The test restores each fixture, sends
//! the same records again and then new ones, and checks that every order is
//! invoiced once, the pending messages are relayed, the dead letters and
//! parked messages are still there, and both versions are known.
//!
//! A release adds its own fixture (a new folder; never change an old one):
//! `INBOXD_UPGRADE_FIXTURE=<release> scripts/test --test integration admin::upgrade::write_fixture -- --ignored`

use super::*;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;

crate::on_both_backends!(databases_written_by_earlier_releases_migrate_and_continue_exactly_once);

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/upgrade")
}

/// What a release wrote for one backend.
#[derive(Serialize, Deserialize)]
struct Written {
    orders_topic: String,
    invoices_topic: String,
    /// Every record it was sent, in the order sent.
    records: Vec<Record>,
    /// Where each partition of `orders_topic` ended once they were sent.
    ends: BTreeMap<i32, i64>,
    dead_letters: i64,
    parked: i64,
    pending: i64,
    /// PostgreSQL roles the dump names, besides the host's login.
    roles: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    release: String,
    sqlite: Written,
    postgres: Written,
}

#[derive(Serialize, Deserialize, Clone)]
struct Record {
    key: String,
    event_id: Option<String>,
    payload: String,
}

impl Record {
    fn of(send: &Send) -> Self {
        Self {
            key: send.key.clone(),
            event_id: send.event_id_header.clone(),
            payload: String::from_utf8(send.payload.clone()).expect("a JSON payload"),
        }
    }

    fn send(&self) -> Send {
        Send {
            key: self.key.clone(),
            event_id_header: self.event_id.clone(),
            payload: self.payload.clone().into_bytes(),
            traceparent: None,
        }
    }

    /// The id of an order billing invoices; `None` for one it rejects.
    fn good_order(&self) -> Option<String> {
        let body: Value = serde_json::from_str(&self.payload).expect("a JSON payload");
        (body["amount_cents"].as_i64() >= Some(0)).then(|| body["event_id"].as_str().unwrap().to_owned())
    }
}

/// `n` orders, each with a fresh id.
fn good_orders(n: usize, prefix: &str) -> Vec<Send> {
    (0..n)
        .map(|i| Send::order(&new_id(), &format!("{prefix}{i}")))
        .collect()
}

/// An order billing rejects (a negative amount): a dead letter.
fn rejected_order(i: usize) -> Send {
    Send::json(
        &new_id(),
        json!({ "order_id": format!("bad{i}"), "customer_email": "x@example.com", "amount_cents": -1 }),
    )
}

fn backend_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    }
}

fn settings(topic: &str, outbox_topic: &str, group: &str) -> Value {
    json!({
        "topics": [topic],
        "group_id": group,
        "outbox_topics": { "invoices.created": outbox_topic },
    })
}

async fn databases_written_by_earlier_releases_migrate_and_continue_exactly_once(backend: Backend) {
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(fixtures_root())
        .expect("tests/fixtures/upgrade")
        .map(|entry| entry.expect("a fixture").path())
        .collect();
    fixtures.sort();
    assert!(
        !fixtures.is_empty(),
        "no upgrade fixture in {}",
        fixtures_root().display()
    );
    for fixture in fixtures {
        continues_from(backend, &fixture).await;
    }
}

async fn continues_from(backend: Backend, fixture: &Path) {
    let manifest: Manifest =
        serde_json::from_slice(&std::fs::read(fixture.join("manifest.json")).expect("manifest.json"))
            .expect("a manifest");
    let written = match backend {
        Backend::Sqlite => &manifest.sqlite,
        Backend::Postgres => &manifest.postgres,
    };
    let from = format!("release {} ({})", manifest.release, backend_name(backend));
    let dir = tempfile::tempdir().expect("tempdir");
    let db_url = restore(backend, fixture, written, dir.path()).await;
    own_group(backend, &db_url).await;

    // The records the release was sent, again (the broker is new), then more.
    create_topic(&written.orders_topic, 3).await;
    create_topic(&written.invoices_topic, 3).await;
    let sent: Vec<Send> = written.records.iter().map(Record::send).collect();
    let ends: BTreeMap<i32, i64> = produce(&written.orders_topic, &sent).await.into_iter().collect();
    assert_eq!(
        ends, written.ends,
        "{from}: the same records must land at the same offsets (did the partitioner change?)"
    );
    let mut more = good_orders(100, "after");
    more.extend(sent.iter().step_by(7).map(|s| Record::of(s).send()));
    let mut ends: HashMap<i32, i64> = ends.into_iter().collect();
    merge_ends(&mut ends, produce(&written.orders_topic, &more).await);
    let good: HashSet<String> = written
        .records
        .iter()
        .chain(more.iter().map(Record::of).collect::<Vec<_>>().iter())
        .filter_map(Record::good_order)
        .collect();

    let mut admin = start_on(dir, db_url, &written.orders_topic, "").await;
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(180), &mut admin.host)
        .await;
    let db = admin.env.db().await;
    let drained = poll_until(Duration::from_secs(120), || async {
        inboxd::db::outbox::backlog(&db, "billing")
            .await
            .map(|(n, _)| n)
            .ok()
            == Some(0)
    })
    .await;
    assert!(
        drained,
        "{from}: the pending messages were not relayed:\n{}",
        admin.host.log()
    );
    assert_eq!(admin.host.terminate(Duration::from_secs(30)).await, Some(0));

    admin.env.assert_exactly_once("invoices", good.len(), &ends).await;
    let dead = count(&db, "SELECT COUNT(*) FROM dead_letters WHERE handler = 'billing'").await;
    assert_eq!(dead, written.dead_letters, "{from}: the dead letters are kept");
    let parked = inboxd::db::outbox::parked_counts(&db)
        .await
        .expect("parked counts");
    assert_eq!(
        parked.get("billing").copied().unwrap_or(0),
        written.parked,
        "{from}: parked messages are kept"
    );
    let versions = count(&db, "SELECT COUNT(*) FROM handlers WHERE name = 'billing'").await;
    assert_eq!(versions, 2, "{from}: both versions are kept");
    let active = count(
        &db,
        "SELECT active_version FROM handler_deployments WHERE name = 'billing'",
    )
    .await;
    assert_eq!(active, 2, "{from}: version 2 stays active");
}

/// The fixture's database, restored into a new one; returns its URL.
async fn restore(backend: Backend, fixture: &Path, written: &Written, dir: &Path) -> String {
    match backend {
        Backend::Sqlite => {
            let file = dir.join("inboxd.sqlite");
            std::fs::copy(fixture.join("sqlite.sqlite"), &file).expect("copy the SQLite fixture");
            format!("sqlite://{}", file.display())
        }
        Backend::Postgres => {
            use sqlx::{Connection, Executor};
            let url = create_postgres_database(&postgres_admin_url()).await;
            // Roles belong to the server, not the dump: the ones it names
            // are made if this server lacks them (the host renews their
            // logins, as it does when another database's host changed one).
            let mut admin = sqlx::PgConnection::connect(&postgres_admin_url()).await.unwrap();
            for role in &written.roles {
                let make = format!(
                    "DO $$ BEGIN CREATE ROLE {role} NOLOGIN; \
                     EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
                );
                admin
                    .execute(make.as_str())
                    .await
                    .expect("create a role the dump names");
            }
            let out = Command::new(pg_tool("psql"))
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &url, "-f"])
                .arg(fixture.join("postgres.sql"))
                .output()
                .expect("run psql");
            assert!(
                out.status.success(),
                "restoring the dump failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            url
        }
    }
}

/// Moves the restored handler to a consumer group of its own. The first
/// fixture named one group for both backends, and the two tests run at once
/// on one broker: two hosts in one group with different topics share every
/// rebalance, and in one CI run the SQLite host was left without partitions
/// for three minutes.
async fn own_group(backend: Backend, db_url: &str) {
    use sqlx::{Connection, Executor};
    let set = |table: &str| {
        format!(
            "UPDATE {table} SET settings = REPLACE(settings, '\"inboxd.billing.upgrade\"', '\"{}\"')",
            unique("inboxd.billing.upgrade")
        )
    };
    match backend {
        Backend::Sqlite => {
            let mut db = sqlx::SqliteConnection::connect(db_url).await.unwrap();
            db.execute(set("handlers").as_str())
                .await
                .expect("move the group");
        }
        Backend::Postgres => {
            let mut db = sqlx::PgConnection::connect(db_url).await.unwrap();
            db.execute(set("inboxd.handlers").as_str())
                .await
                .expect("move the group");
        }
    }
}

fn pg_tool(name: &str) -> PathBuf {
    let bin = std::env::var("INBOXD_TEST_PG_BIN")
        .expect("INBOXD_TEST_PG_BIN is not set: run the suite with scripts/test");
    Path::new(&bin).join(name)
}

/// Writes this build's fixture into `tests/fixtures/upgrade/$INBOXD_UPGRADE_FIXTURE/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes a release's upgrade fixture; run by hand (see the module)"]
async fn write_fixture() {
    let release = std::env::var("INBOXD_UPGRADE_FIXTURE")
        .expect("INBOXD_UPGRADE_FIXTURE names the fixture's folder, e.g. 0.1.0-2026-12-04");
    let out = fixtures_root().join(&release);
    assert!(
        !out.exists(),
        "{} exists: a fixture is never rewritten",
        out.display()
    );
    std::fs::create_dir_all(&out).unwrap();
    let manifest = Manifest {
        sqlite: write_one(Backend::Sqlite, &release, &out).await,
        postgres: write_one(Backend::Postgres, &release, &out).await,
        release,
    };
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
}

async fn write_one(backend: Backend, release: &str, out: &Path) -> Written {
    let name = backend_name(backend);
    let orders_topic = format!("upgrade-{release}-{name}-orders");
    let group = format!("inboxd.billing.upgrade-{name}");
    let invoices_topic = format!("upgrade-{release}-{name}-invoices");
    create_topic(&orders_topic, 3).await;
    create_topic(&invoices_topic, 3).await;
    let mut admin = start(backend, &orders_topic, "").await;
    let billing = std::fs::read(guest_wasm("billing")).expect("billing.wasm");
    let migrations = guest_migrations("billing");

    // Version 1: its messages are parked (the topic can never exist).
    let (status, body) = admin
        .upload(
            "billing",
            billing.clone(),
            settings(&orders_topic, "bad topic!", &group),
            Some(&migrations),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let mut first = good_orders(100, "first");
    first.extend((0..2).map(rejected_order));
    let again: Vec<Send> = first[..100]
        .iter()
        .step_by(10)
        .map(|s| Record::of(s).send())
        .collect();
    first.extend(again);
    let mut ends = produce(&orders_topic, &first).await;
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;
    let db = admin.env.db().await;
    let parked = poll_until(Duration::from_secs(60), || async {
        inboxd::db::outbox::parked_counts(&db)
            .await
            .unwrap_or_default()
            .get("billing")
            == Some(&100)
    })
    .await;
    assert!(
        parked,
        "version 1's messages were not parked:\n{}",
        admin.host.log()
    );

    // Version 2, to a real topic; its host dies as its relay is about to publish.
    let (status, body) = admin
        .upload(
            "billing",
            rebuilt(&billing, "v2"),
            settings(&orders_topic, &invoices_topic, &group),
            Some(&migrations),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["uploaded"]["version"], 2, "{body}");
    assert_eq!(admin.host.terminate(Duration::from_secs(30)).await, Some(0));
    let mut second = good_orders(100, "second");
    second.extend(first[..100].iter().step_by(9).map(|s| Record::of(s).send()));
    merge_ends(&mut ends, produce(&orders_topic, &second).await);
    let mut dying = spawn_inboxd(
        admin.env.dir.path(),
        &admin.env.config_path,
        &[
            ("INBOXD_FAILPOINTS", "relay-before-publish"),
            ("TEST_BILLING_TOKEN", BILLING_TOKEN),
        ],
    );
    let status = dying
        .exited(Duration::from_secs(120))
        .await
        .expect("the second host never hit its failpoint");
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{}", dying.log());

    let pending = inboxd::db::outbox::backlog(&db, "billing").await.unwrap().0;
    assert!(pending > 0, "no message in flight");
    let dead_letters = count(&db, "SELECT COUNT(*) FROM dead_letters WHERE handler = 'billing'").await;
    assert_eq!(dead_letters, 2);
    let roles = snapshot(backend, &admin.env.db_url, out).await;
    Written {
        orders_topic,
        invoices_topic,
        records: first.iter().chain(&second).map(Record::of).collect(),
        ends: ends.into_iter().collect(),
        dead_letters,
        parked: 100,
        pending,
        roles,
    }
}

/// Copies the database into `out`; returns the PostgreSQL roles it names.
async fn snapshot(backend: Backend, db_url: &str, out: &Path) -> Vec<String> {
    use sqlx::{Connection, Executor};
    match backend {
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(db_url).await.unwrap();
            let into = format!("VACUUM INTO '{}'", out.join("sqlite.sqlite").display());
            conn.execute(into.as_str()).await.expect("VACUUM INTO");
            Vec::new()
        }
        Backend::Postgres => {
            let dump = out.join("postgres.sql");
            let status = Command::new(pg_tool("pg_dump"))
                .args(["--no-comments", "-d", db_url, "-f"])
                .arg(&dump)
                .status()
                .expect("run pg_dump");
            assert!(status.success(), "pg_dump failed");
            let text = std::fs::read_to_string(&dump).unwrap();
            let mut conn = sqlx::PgConnection::connect(db_url).await.unwrap();
            let roles: Vec<(String,)> =
                sqlx::query_as("SELECT rolname::text FROM pg_roles WHERE rolname LIKE 'inboxd%'")
                    .fetch_all(&mut conn)
                    .await
                    .unwrap();
            roles
                .into_iter()
                .map(|(r,)| r)
                .filter(|r| text.contains(r.as_str()))
                .collect()
        }
    }
}
