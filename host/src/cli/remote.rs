//! `inboxd deploy`, `handlers`, `activate`, `rollback`, `pause`, `resume` and
//! `delete`: clients of a running host's admin API. The server address and
//! token come from `--server`/`--token` or `INBOXD_SERVER`/`INBOXD_TOKEN`.

use super::CliError;
use super::handler_files::HandlerFiles;
use reqwest::multipart::{Form, Part};
use serde_json::Value;

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
    #[command(flatten)]
    pub files: HandlerFiles,
    #[arg(long)]
    pub name: String,
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

pub async fn deploy(args: DeployArgs) -> Result<(), CliError> {
    let files = &args.files;
    let mut form = Form::new()
        .part(
            "component",
            Part::bytes(files.component_bytes()?).file_name("component.wasm"),
        )
        .text("settings", Value::Object(files.settings()?).to_string());
    for (file, sql) in files.migrations()? {
        form = form.part("migration", Part::text(sql).file_name(file));
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
