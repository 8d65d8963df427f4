//! The `inboxd` command line: argument definitions and one module per command.
//! `main.rs` only parses, sets up logging and maps results to exit codes.

pub mod authoring;
pub mod demo;
pub mod dlq;
pub mod handler_files;
pub mod outbox;
pub mod purge;
pub mod remote;
mod replay_report;
pub mod run;
pub mod status;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "inboxd",
    version,
    about = "Effectively-once Kafka consumption with sandboxed WebAssembly handlers"
)]
pub struct Cli {
    /// `text` for people, `json` (one object per line) for log shippers.
    #[arg(
        long,
        env = "INBOXD_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: crate::telemetry::LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume the configured handlers' topics until SIGTERM or Ctrl-C.
    Run {
        /// The configuration file.
        #[arg(long, short, env = "INBOXD_CONFIG", default_value = "inboxd.toml")]
        config: PathBuf,
    },
    /// Apply the host's and the handlers' database migrations, then exit.
    Migrate {
        #[arg(long, short, env = "INBOXD_CONFIG", default_value = "inboxd.toml")]
        config: PathBuf,
    },
    /// Offsets, dead letters, outbox backlog, relay lag and parked outbox messages, per handler.
    Status(status::StatusArgs),
    /// Inspect, replay and discard dead letters.
    Dlq(dlq::DlqArgs),
    /// Inspect, re-queue and discard outbox messages parked as undeliverable.
    Outbox(outbox::OutboxArgs),
    /// Delete inbox rows past retention now (the host also does it on a schedule).
    Purge(purge::PurgeArgs),
    /// Run the whole pipeline in-process on an embedded broker and SQLite, with duplicates.
    Demo(demo::DemoArgs),
    /// Write a new handler's folder from a template (rust, python, js) that builds as it is.
    New(authoring::new::NewArgs),
    /// Build the handler in this folder into target/NAME.wasm, then check it.
    Build(authoring::build::BuildArgs),
    /// Check offline what an upload of a component and its migrations would refuse.
    Check(authoring::check::CheckArgs),
    /// Run a handler on events from a file through the real pipeline, on a
    /// throwaway database, and compare the end state with what is expected.
    Test(authoring::run_events::TestArgs),
    /// Upload a handler version through a running host's admin API and make it active.
    Deploy(remote::DeployArgs),
    /// List the handlers a running host knows, with their versions.
    Handlers(remote::Remote),
    /// Make an uploaded version of a handler the active one.
    Activate(remote::ActivateArgs),
    /// Go back to the version that was active before the current one.
    Rollback(remote::NameArgs),
    /// Stop consuming for a handler (on every host), after its batches in flight.
    Pause(remote::NameArgs),
    /// Start consuming again for a paused handler.
    Resume(remote::NameArgs),
    /// Stop and remove an uploaded handler; its inbox rows and tables are kept.
    Delete(remote::NameArgs),
}

/// What went wrong, split by the exit code a script sees.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad arguments or configuration: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Anything that failed while running: exit 1.
    #[error("{0}")]
    Failed(String),
}

/// Anything that failed while running, with its message.
pub(crate) fn failed(e: impl std::fmt::Display) -> CliError {
    CliError::Failed(e.to_string())
}

/// A Unix-milliseconds time as RFC 3339, to the second.
pub(crate) fn time(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(at).to_string()
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}
