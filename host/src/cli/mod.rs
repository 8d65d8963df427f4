//! The `inboxd` command line: argument definitions and one module per command.
//! `main.rs` only parses, sets up logging and maps results to exit codes.

pub mod demo;
pub mod dlq;
pub mod purge;
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
    /// Offsets, dead letters, outbox backlog and relay lag, per handler.
    Status(status::StatusArgs),
    /// Inspect, replay and discard dead letters.
    Dlq(dlq::DlqArgs),
    /// Delete inbox rows past retention now (the host also does it on a schedule).
    Purge(purge::PurgeArgs),
    /// Run the whole pipeline in-process on an embedded broker and SQLite, with duplicates.
    Demo(demo::DemoArgs),
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

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}
