//! `inboxd deploy`, `handlers`, `activate`, `rollback`, `pause`, `resume` and
//! `delete`: clients of a running host's admin API. The server address and
//! token come from `--server`/`--token` or `INBOXD_SERVER`/`INBOXD_TOKEN`.

use super::CliError;
use super::handler_files::HandlerFiles;
use reqwest::multipart::{Form, Part};
use serde_json::Value;
use std::path::PathBuf;

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
    /// A PEM file of CA certificates to trust for an https:// --server,
    /// besides the system's (a private CA, or a self-signed certificate).
    #[arg(long, env = "INBOXD_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
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
    /// The HTTP client: rustls with the system's roots, plus --ca-cert's.
    fn client(&self) -> Result<reqwest::Client, CliError> {
        let mut builder = reqwest::Client::builder();
        if let Some(path) = &self.ca_cert {
            let pem =
                std::fs::read(path).map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| usage(format!("{} holds no PEM certificate: {e}", path.display())))?;
            if certificates.is_empty() {
                return Err(usage(format!("{} holds no PEM certificate", path.display())));
            }
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        builder
            .build()
            .map_err(|e| CliError::Failed(format!("cannot set up the HTTP client: {e}")))
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.trim_end_matches('/'))
    }

    /// Sends a request and returns the JSON body of a success, or the API's error.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, CliError> {
        let token = self
            .token
            .as_deref()
            .ok_or_else(|| usage("no token: pass --token or set INBOXD_TOKEN"))?;
        let response = request.bearer_auth(token).send().await.map_err(|e| {
            CliError::Failed(format!(
                "cannot reach the admin API at {}: {}",
                self.server,
                chain(&e)
            ))
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
    let client = remote.client()?;
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
        .send(remote.client()?.get(remote.url("/v1/handlers")))
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
    let client = remote.client()?;
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
    let request = remote
        .client()?
        .post(remote.url(&format!("/v1/handlers/{}/activate", args.name)))
        .json(&serde_json::json!({ "version": args.version }));
    let body = remote.send(request).await?;
    remote.print(&body, |b| summary(&args.name, b));
    Ok(())
}

/// An error with its causes: reqwest's own text leaves out why (a refused
/// connection, a certificate no root vouches for).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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
