//! The admin API and the CLI over it: uploads, hot swap, rollback, pause,
//! auth scopes, dead letters over HTTP, `/metrics` against the database, and
//! uploads that must change nothing.
//!
//! The hosts here start with no handler in their config file: everything
//! they run arrives through the API.

use crate::support::*;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

const OPS_TOKEN: &str = "ops-secret-0123456789abcdef";
const BILLING_TOKEN: &str = "billing-secret-0123456789abcdef";
const NOTIFY_TOKEN: &str = "notify-secret-0123456789abcdef";

struct Admin {
    env: TestEnv,
    host: HostProcess,
    url: String,
    http: reqwest::Client,
}

/// A host with the admin API on a free port and three tokens: `ops`
/// (admin), `billing-team` (billing only, read from the environment) and
/// `notify-team` (notifier only).
async fn start(backend: Backend, topic: &str, extra_admin_toml: &str) -> Admin {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_url = database_url(backend, dir.path()).await;
    let config_path = dir.path().join("inboxd.toml");
    let config = format!(
        r#"
[database]
url = "{db_url}"

[kafka]
brokers = "{brokers}"
session_timeout_ms = 6000

[wasm]
cache_dir = "{cache}"

[admin]
listen = "127.0.0.1:0"
{extra_admin_toml}

[[admin.tokens]]
name = "ops"
token = "{OPS_TOKEN}"
admin = true

[[admin.tokens]]
name = "billing-team"
token_env = "TEST_BILLING_TOKEN"
handlers = ["billing"]

[[admin.tokens]]
name = "notify-team"
token = "{NOTIFY_TOKEN}"
handlers = ["notifier"]
"#,
        brokers = brokers(),
        cache = dir.path().join("compile-cache").display(),
    );
    std::fs::write(&config_path, config).expect("write config");
    let mut host = spawn_inboxd(
        dir.path(),
        &config_path,
        &[
            ("TEST_BILLING_TOKEN", BILLING_TOKEN),
            ("INBOXD_LOG_FORMAT", "json"),
        ],
    );
    let mut addr = None;
    let listening = poll_until(Duration::from_secs(60), || {
        addr = listening_addr(&host.log());
        let found = addr.is_some();
        async move { found }
    })
    .await;
    assert!(
        listening && host.is_running(),
        "the admin API never listened:\n{}",
        host.log()
    );
    let env = TestEnv {
        dir,
        db_url,
        config_path,
        handler: "billing".into(),
        topic: topic.to_owned(),
    };
    Admin {
        env,
        host,
        url: format!("http://{}", addr.expect("polled above")),
        http: reqwest::Client::new(),
    }
}

/// The admin address from the host's JSON log line "admin API listening".
fn listening_addr(log: &str) -> Option<String> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["fields"]["message"] == "admin API listening")
        .and_then(|line| line["fields"]["addr"].as_str().map(str::to_owned))
}

/// A component's bytes plus a custom section: a different SHA-256, the same behaviour.
fn rebuilt(wasm: &[u8], tag: &str) -> Vec<u8> {
    let mut payload = vec![tag.len() as u8];
    payload.extend_from_slice(tag.as_bytes());
    payload.extend_from_slice(b"test build");
    let mut bytes = wasm.to_vec();
    bytes.push(0); // custom section id
    bytes.push(payload.len() as u8); // LEB128 of a size below 128
    bytes.extend_from_slice(&payload);
    bytes
}

fn migration_form(dir: &Path, mut form: reqwest::multipart::Form) -> reqwest::multipart::Form {
    for entry in std::fs::read_dir(dir).expect("migrations folder") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let sql = std::fs::read_to_string(&path).expect("migration");
        form = form.part("migration", reqwest::multipart::Part::text(sql).file_name(name));
    }
    form
}

impl Admin {
    async fn call(&self, request: reqwest::RequestBuilder, token: Option<&str>) -> (u16, Value) {
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await.expect("admin API request");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn upload(
        &self,
        name: &str,
        component: Vec<u8>,
        settings: Value,
        migrations: Option<&Path>,
        token: &str,
    ) -> (u16, Value) {
        let mut form = reqwest::multipart::Form::new()
            .part(
                "component",
                reqwest::multipart::Part::bytes(component).file_name("c.wasm"),
            )
            .text("settings", settings.to_string());
        if let Some(dir) = migrations {
            form = migration_form(dir, form);
        }
        let request = self
            .http
            .post(format!("{}/v1/handlers/{name}", self.url))
            .multipart(form);
        self.call(request, Some(token)).await
    }

    async fn post(&self, path: &str, token: &str) -> (u16, Value) {
        self.call(self.http.post(format!("{}{path}", self.url)), Some(token))
            .await
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.call(self.http.get(format!("{}{path}", self.url)), token)
            .await
    }

    /// Runs an `inboxd` CLI command against this host's API.
    async fn cli(&self, args: &[&str], token: &str) -> std::process::Output {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_inboxd"))
            .args(args)
            .env("INBOXD_SERVER", &self.url)
            .env("INBOXD_TOKEN", token)
            .env("INBOXD_LOG", "warn")
            .output()
            .await
            .expect("run the inboxd CLI")
    }

    async fn metrics(&self) -> String {
        let response = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .expect("scrape");
        assert_eq!(response.status().as_u16(), 200);
        response.text().await.expect("metrics text")
    }
}

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
    let group = unique("group");
    std::fs::write(
        &settings,
        json!({ "group_id": group, "batch": { "max_events": 20 } }).to_string(),
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
    let stop = tokio_util::sync::CancellationToken::new();
    let trickle = tokio::spawn(trickle_orders(topic.clone(), stop.clone()));
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
            json!({ "topics": [topic], "group_id": group, "batch": { "max_events": 10 } }),
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
    stop.cancel();
    let (trickled_ends, trickled) = trickle.await.expect("the producer task");
    merge_ends(&mut ends, trickled_ends);
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
    let (status, body) = admin.post("/v1/handlers/billing/pause", BILLING_TOKEN).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["running"]["consuming"], false, "{body}");
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
    let (status, _) = admin
        .get(&format!("/v1/dead-letters/{id}"), Some(NOTIFY_TOKEN))
        .await;
    assert_eq!(status, 403);
    let (status, shown) = admin
        .get(&format!("/v1/dead-letters/{id}"), Some(BILLING_TOKEN))
        .await;
    assert_eq!(status, 200);
    assert_eq!(shown["kind"], "event-id", "{shown}");
    let replay_all = |token: &'static str| {
        admin.call(
            admin
                .http
                .post(format!("{}/v1/dead-letters/replay", admin.url))
                .json(&json!({ "handler": "billing" })),
            Some(token),
        )
    };
    assert_eq!(replay_all(NOTIFY_TOKEN).await.0, 403);
    let (status, outcomes) = replay_all(BILLING_TOKEN).await;
    assert_eq!(status, 200, "{outcomes}");
    let outcomes: Vec<&str> = outcomes
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["outcome"].as_str().unwrap())
        .collect();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_required_and_scoped_to_their_handlers() {
    let topic = unique("admin-auth");
    create_topic(&topic, 1).await;
    let admin = start(Backend::Sqlite, &topic, "").await;
    let notifier = std::fs::read(guest_wasm("notifier")).expect("notifier.wasm");
    let settings = json!({ "topics": [topic], "group_id": unique("group") });

    let (status, body) = admin.get("/v1/handlers", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("missing bearer token"),
        "{body}"
    );
    let (status, body) = admin.get("/v1/handlers", Some("not-a-token-at-all-1234")).await;
    assert_eq!((status, &body["error"]), (401, &json!("unknown token")));

    // The billing team cannot upload the notifier; the notify team can.
    let (status, body) = admin
        .upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(&guest_migrations("notifier")),
            BILLING_TOKEN,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("may not manage handler \"notifier\""),
        "{body}"
    );
    let (status, body) = admin
        .upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(&guest_migrations("notifier")),
            NOTIFY_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");

    // Another team's token can neither pause, roll back, nor delete it.
    for path in ["pause", "rollback", "resume"] {
        let (status, body) = admin
            .post(&format!("/v1/handlers/notifier/{path}"), BILLING_TOKEN)
            .await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    let deleted = admin
        .call(
            admin.http.delete(format!("{}/v1/handlers/notifier", admin.url)),
            Some(BILLING_TOKEN),
        )
        .await;
    assert_eq!(deleted.0, 403);
    let db = admin.env.db().await;
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM handler_deployments WHERE name = 'notifier' AND paused = 0"
        )
        .await,
        1,
        "the notifier is still deployed and running"
    );
    let (_, listed) = admin.get("/v1/handlers", Some(BILLING_TOKEN)).await;
    assert_eq!(listed, json!([]), "a team sees only its own handlers");
    let (_, listed) = admin.get("/v1/handlers", Some(OPS_TOKEN)).await;
    assert_eq!(listed[0]["name"], "notifier");

    // The owner may: roll back has nothing to go back to, delete works.
    let (status, body) = admin.post("/v1/handlers/notifier/rollback", NOTIFY_TOKEN).await;
    assert_eq!(status, 409, "{body}");
    let deleted = admin
        .call(
            admin.http.delete(format!("{}/v1/handlers/notifier", admin.url)),
            Some(NOTIFY_TOKEN),
        )
        .await;
    assert_eq!(deleted.0, 200, "{}", deleted.1);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM handlers").await, 0);
    let log = admin.host.log();
    for secret in [OPS_TOKEN, BILLING_TOKEN, NOTIFY_TOKEN] {
        assert!(!log.contains(secret), "a token was logged");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_upload_changes_nothing_and_says_why() {
    let topic = unique("admin-bad");
    create_topic(&topic, 1).await;
    let admin = start(Backend::Sqlite, &topic, "max_component_mb = 1").await;
    let notifier = std::fs::read(guest_wasm("notifier")).expect("notifier.wasm");
    let settings = json!({ "topics": [topic], "group_id": unique("group") });
    let migrations = guest_migrations("notifier");
    let (status, body) = admin
        .upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(&migrations),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let db = admin.env.db().await;
    let table = db.handler_table("notifier", "emails");

    let component = |wat: &str| wat::parse_str(wat).expect("valid WAT");
    let cases: Vec<(&str, Vec<u8>, Value, u16, &str)> = vec![
        (
            "no export",
            component("(component)"),
            settings.clone(),
            422,
            "handle",
        ),
        (
            "forbidden import",
            component(
                r#"(component (import "wasi:http/outgoing-handler@0.2.0" (instance (export "handle" (func)))))"#,
            ),
            settings.clone(),
            422,
            "wasi:http/outgoing-handler",
        ),
        (
            "core module",
            component("(module)"),
            settings.clone(),
            422,
            "core WebAssembly module",
        ),
        (
            "too large",
            vec![0; 2 << 20],
            settings.clone(),
            413,
            "max_component_mb",
        ),
        (
            "unknown setting",
            notifier.clone(),
            json!({ "topics": [topic], "topicz": 1 }),
            422,
            "topicz",
        ),
        ("no topics", notifier.clone(), json!({}), 422, "topics"),
    ];
    for (case, bytes, settings, want, says) in cases {
        let (status, body) = admin.upload("notifier", bytes, settings, None, OPS_TOKEN).await;
        assert_eq!(status, want, "{case}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{case}: {error:?} should mention {says:?}");
    }

    // A migration that fails: the version is not stored, nothing it did stays.
    let broken = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        migrations.join("0001_emails.sql"),
        broken.path().join("0001_emails.sql"),
    )
    .unwrap();
    std::fs::write(
        broken.path().join("0002_more.sql"),
        "CREATE TABLE extra (a TEXT); CREAT TABLE nope;",
    )
    .unwrap();
    let (status, body) = admin
        .upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(broken.path()),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("0002_more"), "{body}");
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM handlers WHERE name = 'notifier'").await,
        1
    );
    assert_eq!(
        count(
            &db,
            "SELECT active_version FROM handler_deployments WHERE name = 'notifier'"
        )
        .await,
        1
    );
    assert!(
        db.query("SELECT * FROM extra", &[]).await.is_err(),
        "the failed migration's table does not exist"
    );
    // The running version still works.
    let id = new_id();
    let ends = produce(
        &topic,
        &[Send::json(
            &id,
            json!({ "order_id": "o-1", "customer_email": "a@example.com" }),
        )],
    )
    .await;
    let mut env_host = admin;
    env_host.env.handler = "notifier".into();
    env_host
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut env_host.host)
        .await;
    assert_eq!(count(&db, &format!("SELECT COUNT(*) FROM {table}")).await, 1);
}

/// A host without the admin API, on the same database as `admin`: it runs
/// only what was uploaded through `admin`'s host.
fn spawn_follower(admin: &Admin) -> HostProcess {
    let config = std::fs::read_to_string(&admin.env.config_path).expect("config");
    let plain = config.split("[admin]").next().expect("config head").to_owned();
    let path = admin.env.dir.path().join("follower.toml");
    std::fs::write(&path, plain).expect("write follower config");
    spawn_inboxd(admin.env.dir.path(), &path, &[("INBOXD_LOG_FORMAT", "json")])
}

/// Any JSON log line of `host` whose message is `message` and whose fields match `fields`.
fn logged(host: &HostProcess, message: &str, fields: &[(&str, Value)]) -> bool {
    host.log()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .any(|line| {
            line["fields"]["message"] == message && fields.iter().all(|(k, v)| &line["fields"][*k] == v)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_reaches_every_host_of_the_group() {
    let topic = unique("admin-group");
    create_topic(&topic, 4).await;
    let mut admin = start(Backend::Postgres, &topic, "").await;
    let mut follower = spawn_follower(&admin);
    let billing = std::fs::read(guest_wasm("billing")).expect("billing.wasm");
    let settings = json!({ "topics": [topic], "group_id": unique("group") });
    let (status, body) = admin
        .upload(
            "billing",
            billing.clone(),
            settings.clone(),
            Some(&guest_migrations("billing")),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let loaded = poll_until(Duration::from_secs(30), || {
        let seen = logged(&follower, "handler loaded", &[("handler", json!("billing"))]);
        async move { seen }
    })
    .await;
    assert!(
        loaded,
        "the other host never loaded the upload:\n{}",
        follower.log()
    );

    let records = orders_with_duplicates(400, 5);
    let ends = produce(&topic, &records).await;
    let shared = poll_until(Duration::from_secs(60), || {
        let assigned = follower.log().lines().any(|l| {
            serde_json::from_str::<Value>(l).is_ok_and(|line| {
                line["fields"]["message"] == "partitions assigned"
                    && line["fields"]["partitions"].as_str().is_some_and(|p| p != "[]")
            })
        });
        async move { assigned }
    })
    .await;
    assert!(shared, "the other host never got partitions:\n{}", follower.log());
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;

    // Version 2 through one host: the other follows.
    let (status, body) = admin
        .upload("billing", rebuilt(&billing, "v2"), settings, None, OPS_TOKEN)
        .await;
    assert_eq!(status, 201, "{body}");
    let swapped = poll_until(Duration::from_secs(30), || {
        let seen = logged(&follower, "handler version activated", &[("to", json!(2))]);
        async move { seen }
    })
    .await;
    assert!(swapped, "the other host never switched:\n{}", follower.log());
    let more = orders_with_duplicates(200, 5);
    let mut all_ends = ends.clone();
    for (partition, end) in produce(&topic, &more).await {
        all_ends.insert(partition, end);
    }
    admin
        .env
        .wait_for_offsets(&all_ends, Duration::from_secs(120), &mut admin.host)
        .await;
    admin.env.assert_exactly_once("invoices", 600, &all_ends).await;
    let db = admin.env.db().await;
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM inbox WHERE handler = 'billing' AND handler_version = '2'"
        )
        .await,
        200,
        "every order sent after both hosts switched ran on version 2"
    );
    assert!(follower.is_running() && admin.host.is_running());
    assert_eq!(follower.terminate(Duration::from_secs(30)).await, Some(0));
    assert_eq!(admin.host.terminate(Duration::from_secs(30)).await, Some(0));
}
