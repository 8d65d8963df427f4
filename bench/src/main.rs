//! `inboxd-bench`: end-to-end events/s and latency, side by side, in one run.
//!
//! For each backend it runs the modes over the same input, each with a
//! fresh database and consumer group, each consumer in a child process:
//! (plain) a batched consumer written without Inboxd, the in-run ceiling,
//! (a) Inboxd as configured by default (micro-batches), (b) one event per
//! transaction (`batch.max_events = 1`, the classic inbox) with the same
//! partition parallelism, (c) a native Rust billing handler through the same
//! pipeline, and (d) as (a) with `instances.reuse` (one instance serves
//! consecutive events). Throughput: a backlog of `--events` records is consumed and
//! timed from the first commit to the last. Latency: then `--rate` records/s
//! arrive live for `--live-secs`, and each applied event's time from produce
//! to commit is recorded, and again at half of (a)'s throughput. CPU time
//! per event of the consumer, PostgreSQL and the broker over the backlog,
//! and how long the relay takes to drain, are reported beside. Before the modes, the broker-only ceiling: the
//! same backlog read by librdkafka with no database or handler. The last
//! stdout line is one JSON object.
//! `scripts/bench` starts the broker and PostgreSQL and runs this.

mod ceiling;
mod child;
mod native;
mod plain;
mod plain_relay;
mod run;
mod serve;
mod usage;
mod workload;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "inboxd-bench",
    about = "Throughput and latency of Inboxd, side by side"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: run::Options,
}

#[derive(Subcommand)]
enum Command {
    /// Internal: one benchmark host (a child process of the benchmark).
    #[command(hide = true)]
    Serve {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        native: bool,
        /// With --native: milliseconds each event waits in its transaction.
        #[arg(long, default_value_t = 0)]
        handler_ms: u64,
    },
    /// Internal: the plain consumer of mode `plain` (a child process).
    #[command(hide = true)]
    ServePlain {
        #[arg(long)]
        database: String,
        #[arg(long)]
        brokers: String,
        #[arg(long, value_delimiter = ',')]
        topics: Vec<String>,
        #[arg(long)]
        group: String,
        #[arg(long)]
        fetch_wait_ms: u32,
        /// Mode `po`: write an outbox and relay it to this topic.
        #[arg(long)]
        outbox_topic: Option<String>,
    },
}

fn main() {
    // SAFETY: no other thread exists yet; the runtime starts below. Here for
    // the same reason as in `inboxd` (its hosts are this binary's children).
    unsafe { inboxd::telemetry::library_backtraces_off_unless_asked() };
    start();
}

#[tokio::main]
async fn start() {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Serve {
            config,
            native,
            handler_ms,
        }) => {
            // No spans: the benchmark measures the pipeline without an exporter.
            let _ = inboxd::telemetry::init("warn", inboxd::telemetry::LogFormat::Text, None);
            serve::serve(&config, native, handler_ms).await
        }
        Some(Command::ServePlain {
            database,
            brokers,
            topics,
            group,
            fetch_wait_ms,
            outbox_topic,
        }) => {
            let opts = plain::Options {
                database: &database,
                brokers: &brokers,
                topics: &topics,
                group: &group,
                fetch_wait_ms,
                outbox_topic: outbox_topic.as_deref(),
            };
            plain::serve(opts).await
        }
        None => run::run(cli.run).await,
    };
    if let Err(error) = result {
        eprintln!("inboxd-bench: {error:#}");
        std::process::exit(1);
    }
}
