//! `inboxd deploy`, `handlers`, `activate`, `rollback`, `pause`, `resume` and
//! `delete`: clients of a running host's admin API. The server address and
//! token come from `--server`/`--token` or `INBOXD_SERVER`/`INBOXD_TOKEN`.

use super::CliError;
use reqwest::multipart::{Form, Part};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Remote {
    /// The admin API's address.
    #[arg(
        long,
        env = "INBOXD_SERVER",
        default_value = "http://127.0.0.1:8480",
        global = true
    )]
    pub server: String,
    /// A bearer token from the host's [[admin.tokens]].
    #[arg(long, env = "INBOXD_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Print the API's JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct DeployArgs {
    /// The handler's component (`.wasm`, built for wasm32-wasip2).
    pub component: PathBuf,
    #[arg(long)]
    pub name: String,
    /// A topic to consume (repeat for several). Overrides `topics` in --settings.
    #[arg(long = "topic")]
    pub topics: Vec<String>,
    /// A folder of `NNNN_name.sql` migrations for the handler's own tables.
    #[arg(long)]
    pub migrations: Option<PathBuf>,
    /// A JSON file with any other keys of a [[handlers]] entry (event_id, limits, retry, ...).
    #[arg(long)]
    pub settings: Option<PathBuf>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, clap::Args)]
pub struct NameArgs {
    pub name: String,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, clap::Args)]
pub struct ActivateArgs {
    pub name: String,
    pub version: i64,
    #[command(flatten)]
    pub remote: Remote,
}

fn usage(message: impl Into<String>) -> CliError {
    CliError::Usage(message.into())
}

impl Remote {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.trim_end_matches('/'))
    }

    /// Sends a request and returns the JSON body of a success, or the API's error.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, CliError> {
        let token = self
            .token
            .as_deref()
            .ok_or_else(|| usage("no token: pass --token or set INBOXD_TOKEN"))?;
        let response =
            request.bearer_auth(token).send().await.map_err(|e| {
                CliError::Failed(format!("cannot reach the admin API at {}: {e}", self.server))
            })?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        let message = body["error"].as_str().unwrap_or("no details").to_owned();
        Err(if status.is_client_error() {
            usage(format!("{status}: {message}"))
        } else {
            CliError::Failed(format!("{status}: {message}"))
        })
    }

    fn print(&self, value: &Value, text: impl FnOnce(&Value)) {
        if self.json {
            println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
        } else {
            text(value);
        }
    }
}

fn settings_json(args: &DeployArgs) -> Result<String, CliError> {
    let mut settings = match &args.settings {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
            serde_json::from_str::<Value>(&text)
                .map_err(|e| usage(format!("{} is not JSON: {e}", path.display())))?
        }
        None => Value::Object(Default::default()),
    };
    if !settings.is_object() {
        return Err(usage("--settings must hold a JSON object"));
    }
    if !args.topics.is_empty() {
        settings["topics"] = args.topics.clone().into();
    }
    Ok(settings.to_string())
}

fn migration_parts(dir: &Path, mut form: Form) -> Result<Form, CliError> {
    let entries = std::fs::read_dir(dir).map_err(|e| usage(format!("cannot read {}: {e}", dir.display())))?;
    for entry in entries {
        let path = entry.map_err(|e| usage(e.to_string()))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("sql") {
            continue;
        }
        let sql = std::fs::read_to_string(&path)
            .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        form = form.part("migration", Part::text(sql).file_name(file));
    }
    Ok(form)
}

pub async fn deploy(args: DeployArgs) -> Result<(), CliError> {
    let bytes = std::fs::read(&args.component)
        .map_err(|e| usage(format!("cannot read {}: {e}", args.component.display())))?;
    let mut form = Form::new()
        .part("component", Part::bytes(bytes).file_name("component.wasm"))
        .text("settings", settings_json(&args)?);
    if let Some(dir) = &args.migrations {
        form = migration_parts(dir, form)?;
    }
    let remote = &args.remote;
    let client = reqwest::Client::new();
    let url = remote.url(&format!("/v1/handlers/{}", args.name));
    let body = remote.send(client.post(url).multipart(form)).await?;
    remote.print(&body, |b| {
        println!(
            "{} version {} uploaded and active (sha256 {})",
            args.name,
            b["uploaded"]["version"],
            b["uploaded"]["sha256"].as_str().unwrap_or("?")
        )
    });
    Ok(())
}

pub async fn handlers(remote: Remote) -> Result<(), CliError> {
    let body = remote
        .send(reqwest::Client::new().get(remote.url("/v1/handlers")))
        .await?;
    remote.print(&body, |b| {
        println!(
            "{:<20} {:<7} {:<8} {:<9} {:<8} VERSIONS",
            "NAME", "SOURCE", "ACTIVE", "CONSUMING", "PAUSED"
        );
        for h in b.as_array().into_iter().flatten() {
            let active = match &h["deployment"]["active_version"] {
                Value::Null => h["running"]["version"].as_str().unwrap_or("-").to_owned(),
                v => v.to_string(),
            };
            let versions: Vec<String> = h["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v["version"].to_string())
                .collect();
            println!(
                "{:<20} {:<7} {:<8} {:<9} {:<8} {}",
                h["name"].as_str().unwrap_or("?"),
                h["source"].as_str().unwrap_or("?"),
                active,
                h["running"]["consuming"].as_bool().unwrap_or(false),
                h["deployment"]["paused"].as_bool().unwrap_or(false),
                versions.join(",")
            );
        }
    });
    Ok(())
}

/// `pause`, `resume`, `rollback` and `delete`: one call on one handler.
pub async fn action(action: &str, args: NameArgs) -> Result<(), CliError> {
    let remote = &args.remote;
    let client = reqwest::Client::new();
    let request = match action {
        "delete" => client.delete(remote.url(&format!("/v1/handlers/{}", args.name))),
        _ => client.post(remote.url(&format!("/v1/handlers/{}/{action}", args.name))),
    };
    let body = remote.send(request).await?;
    remote.print(&body, |b| summary(&args.name, b));
    Ok(())
}

pub async fn activate(args: ActivateArgs) -> Result<(), CliError> {
    let remote = &args.remote;
    let request = reqwest::Client::new()
        .post(remote.url(&format!("/v1/handlers/{}/activate", args.name)))
        .json(&serde_json::json!({ "version": args.version }));
    let body = remote.send(request).await?;
    remote.print(&body, |b| summary(&args.name, b));
    Ok(())
}

fn summary(name: &str, body: &Value) {
    if body.get("deleted").is_some() {
        println!("{name} deleted (its inbox rows, dead letters and tables are kept)");
        return;
    }
    let deployment = &body["deployment"];
    println!(
        "{name}: active version {}, {}",
        deployment["active_version"],
        if deployment["paused"].as_bool().unwrap_or(false) {
            "paused"
        } else {
            "consuming"
        }
    );
}
