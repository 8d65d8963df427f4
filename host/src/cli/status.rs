//! `inboxd status`: what each handler has done and what is waiting, read from
//! the database (so it works for any number of hosts): stored offsets, parked
//! dead letters, the outbox backlog with the relay's lag (the age of the
//! oldest message not yet published), and outbox messages parked because the
//! broker will never accept them (`inboxd outbox list` shows them).

use super::{CliError, failed};
use crate::config::Config;
use crate::db::{dead_letters, now_ms, offsets, outbox};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[arg(long, short, env = "INBOXD_CONFIG", default_value = "inboxd.toml")]
    pub config: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, serde::Serialize)]
struct HandlerStatus {
    handler: String,
    partitions: Vec<PartitionStatus>,
    records_committed: i64,
    dead_letters_parked: i64,
    outbox_backlog: i64,
    /// Outbox messages parked (never deliverable) and not discarded.
    outbox_parked: i64,
    /// Age of the oldest unpublished outbox message, in milliseconds.
    relay_lag_ms: Option<i64>,
}

#[derive(Debug, serde::Serialize)]
struct PartitionStatus {
    topic: String,
    partition: i32,
    next_offset: i64,
}

pub async fn status(args: StatusArgs) -> Result<(), CliError> {
    let config = Config::load(&args.config).map_err(|e| CliError::Usage(e.to_string()))?;
    let db = crate::db::open(&config).await.map_err(failed)?;
    let mut report = Vec::new();
    // The config's handlers, then those uploaded through the admin API.
    let mut names: Vec<String> = config.handlers.iter().map(|h| h.name.clone()).collect();
    for deployment in crate::registry::store::deployments(&db).await.map_err(failed)? {
        if !names.contains(&deployment.name) {
            names.push(deployment.name);
        }
    }
    let parked = outbox::parked_counts(&db).await.map_err(failed)?;
    let letters = dead_letters::parked_counts(&db).await.map_err(failed)?;
    for name in &names {
        let positions = offsets::load_all(&db, name).await.map_err(failed)?;
        let (backlog, oldest) = outbox::backlog(&db, name).await.map_err(failed)?;
        report.push(HandlerStatus {
            handler: name.clone(),
            records_committed: positions.iter().map(|p| p.records_committed).sum(),
            partitions: positions
                .into_iter()
                .map(|p| PartitionStatus {
                    topic: p.topic,
                    partition: p.partition,
                    next_offset: p.next_offset,
                })
                .collect(),
            dead_letters_parked: letters.get(name).copied().unwrap_or(0),
            outbox_backlog: backlog,
            outbox_parked: parked.get(name).copied().unwrap_or(0),
            relay_lag_ms: oldest.map(|created| (now_ms() - created).max(0)),
        });
    }
    db.close().await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(failed)?);
        return Ok(());
    }
    for h in &report {
        let lag = h
            .relay_lag_ms
            .map_or("-".to_owned(), |ms| format!("{:.1} s", ms as f64 / 1000.0));
        println!(
            "{}: {} records committed, {} dead letters parked, outbox backlog {} (relay lag {lag})",
            h.handler, h.records_committed, h.dead_letters_parked, h.outbox_backlog
        );
        if h.outbox_parked > 0 {
            println!(
                "  {} outbox messages parked, never deliverable as they are: `inboxd outbox list --handler {}`",
                h.outbox_parked, h.handler
            );
        }
        for p in &h.partitions {
            println!("  {}/{}: next offset {}", p.topic, p.partition, p.next_offset);
        }
    }
    Ok(())
}
