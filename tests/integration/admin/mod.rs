//! The admin API and the CLI over it: uploads, hot swap, rollback, pause,
//! auth scopes, per-token ceilings and allowlists, dead letters over HTTP, `/metrics` against the database,
//! uploads that must change nothing, and an upload reaching a second host.
//!
//! The hosts here start with no handler in their config file: everything
//! they run arrives through the API. This module is the harness; each
//! submodule is one scenario.

mod auth;
mod authoring;
mod ceilings;
mod console;
mod group;
mod group_pages;
mod lifecycle;
mod places;
mod tls;
mod upgrade;
mod uploads;
mod walls;

use crate::support::*;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const OPS_TOKEN: &str = "ops-secret-0123456789abcdef";
const BILLING_TOKEN: &str = "billing-secret-0123456789abcdef";
const NOTIFY_TOKEN: &str = "notify-secret-0123456789abcdef";

/// billing's `outbox_topics` for upload settings: without it, the host
/// refuses its `invoices.created` messages.
fn billing_outbox() -> Value {
    serde_json::json!({ "invoices.created": "invoices.created" })
}

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
    start_on(dir, db_url, topic, extra_admin_toml).await
}

/// As [`start`], on the database at `db_url`, with files in `dir`.
async fn start_on(dir: tempfile::TempDir, db_url: String, topic: &str, extra_admin_toml: &str) -> Admin {
    start_configured(dir, db_url, topic, "", extra_admin_toml).await
}

/// As [`start_on`], with `wasm_toml` in the config's `[wasm]` section.
async fn start_configured(
    dir: tempfile::TempDir,
    db_url: String,
    topic: &str,
    wasm_toml: &str,
    extra_admin_toml: &str,
) -> Admin {
    let cache = dir.path().join("compile-cache");
    // `TestEnv::with_config` writes this right after `[wasm] cache_dir`.
    let admin = format!(
        r#"{wasm_toml}

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
tables = ["billing_*"]

[[admin.tokens]]
name = "notify-team"
token = "{NOTIFY_TOKEN}"
handlers = ["notifier"]
"#
    );
    let env = TestEnv::with_config(dir, db_url, &cache, "billing", topic, &admin);
    let mut host = spawn_inboxd(
        env.dir.path(),
        &env.config_path,
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
    Admin {
        env,
        host,
        url: format!("http://{}", addr.expect("polled above")),
        // No kept-alive connections: the API answers a refused upload (403)
        // without reading its body, and then closes that connection; a
        // request reusing it failed with "IncompleteMessage" (a flake).
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("HTTP client"),
    }
}

/// A fresh consumer group that a team token may use for handler `name`:
/// team tokens are held to `inboxd.<name>` and `inboxd.<name>.*`.
fn team_group(name: &str) -> String {
    format!("inboxd.{name}.{}", unique("test"))
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
        self.try_call(request, token).await.expect("admin API request")
    }

    /// As [`Admin::call`], with the client's error if the request could not
    /// be sent whole.
    async fn try_call(
        &self,
        request: reqwest::RequestBuilder,
        token: Option<&str>,
    ) -> Result<(u16, Value), reqwest::Error> {
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    async fn upload(
        &self,
        name: &str,
        component: Vec<u8>,
        settings: Value,
        migrations: Option<&Path>,
        token: &str,
    ) -> (u16, Value) {
        self.try_upload(name, component, settings, migrations, token)
            .await
            .expect("admin API request")
    }

    /// As [`Admin::upload`], with the client's error if the request could
    /// not be sent whole.
    async fn try_upload(
        &self,
        name: &str,
        component: Vec<u8>,
        settings: Value,
        migrations: Option<&Path>,
        token: &str,
    ) -> Result<(u16, Value), reqwest::Error> {
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
        self.try_call(request, Some(token)).await
    }

    /// Uploads guest `name` (`billing`, `notifier`, ...) with its own
    /// migrations and `settings`, as `token`.
    async fn upload_guest(&self, name: &str, settings: Value, token: &str) -> (u16, Value) {
        let component = std::fs::read(guest_wasm(name)).expect("the guest's component");
        self.upload(name, component, settings, Some(&guest_migrations(name)), token)
            .await
    }

    async fn post(&self, path: &str, token: &str) -> (u16, Value) {
        self.call(self.http.post(format!("{}{path}", self.url)), Some(token))
            .await
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.call(self.http.get(format!("{}{path}", self.url)), token)
            .await
    }

    async fn delete(&self, path: &str, token: &str) -> (u16, Value) {
        self.call(self.http.delete(format!("{}{path}", self.url)), Some(token))
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
