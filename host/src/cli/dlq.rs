//! `inboxd dlq`: inspect, replay and discard dead letters.
//!
//! Output is a readable table or block for people, and with `--json` one JSON
//! document for scripts. Every error says what was wrong and what to do.

use super::{CliError, failed, time};
use crate::config::Config;
use crate::db::Database;
use crate::db::dead_letters::{self, Filter, Row, bytes_text};
use crate::registry::load::load_handler;
use crate::registry::load::load_uploaded;
use crate::registry::store;
use crate::replay::{ReplayOutcome, replay};
use crate::wasm::{HandlerComponent, WasmEngine};
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct DlqArgs {
    #[arg(
        long,
        short,
        env = "INBOXD_CONFIG",
        default_value = "inboxd.toml",
        global = true
    )]
    pub config: PathBuf,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: DlqCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum DlqCommand {
    /// Dead letters still parked (with --all, also replayed and discarded ones).
    List {
        #[arg(long)]
        handler: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// One dead letter in full: record, headers, payload, reason, history.
    Show { id: i64 },
    /// Run dead letters through their handler again, with a fresh claim.
    Replay {
        /// Dead letter ids.
        ids: Vec<i64>,
        /// With --all: every parked dead letter of this handler.
        #[arg(long)]
        handler: Option<String>,
        #[arg(long, requires = "handler")]
        all: bool,
    },
    /// Mark dead letters as handled without running them (they stay for the record).
    Discard {
        #[arg(required = true)]
        ids: Vec<i64>,
    },
}

fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    println!("{}", serde_json::to_string_pretty(value).map_err(failed)?);
    Ok(())
}

/// Fetches the named dead letters, failing with the ids that do not exist.
async fn fetch(db: &Database, ids: &[i64]) -> Result<Vec<Row>, CliError> {
    let rows = dead_letters::find(
        db,
        &Filter {
            ids: Some(ids),
            include_resolved: true,
            ..Filter::default()
        },
    )
    .await
    .map_err(failed)?;
    let missing: Vec<String> = ids
        .iter()
        .filter(|id| !rows.iter().any(|r| r.id == **id))
        .map(i64::to_string)
        .collect();
    if !missing.is_empty() {
        return Err(CliError::Usage(format!(
            "no dead letter with id {}: run `inboxd dlq list --all` to see the ids",
            missing.join(", ")
        )));
    }
    Ok(rows)
}

pub async fn dlq(args: DlqArgs) -> Result<(), CliError> {
    let config = Config::load(&args.config).map_err(|e| CliError::Usage(e.to_string()))?;
    let db = crate::db::open(&config).await.map_err(failed)?;
    let result = match &args.command {
        DlqCommand::List { handler, all } => list(&db, handler.as_deref(), *all, args.json).await,
        DlqCommand::Show { id } => show(&db, *id, args.json).await,
        DlqCommand::Replay { ids, handler, all } => {
            if ids.is_empty() != *all {
                return Err(CliError::Usage(
                    "name the dead letter ids to replay, or use --handler NAME --all (not both)".into(),
                ));
            }
            replay_many(&db, &config, ids, handler.as_deref(), args.json).await
        }
        DlqCommand::Discard { ids } => discard(&db, ids, args.json).await,
    };
    db.close().await;
    result
}

async fn list(db: &Database, handler: Option<&str>, all: bool, json: bool) -> Result<(), CliError> {
    let rows = dead_letters::find(
        db,
        &Filter {
            handler,
            include_resolved: all,
            ..Filter::default()
        },
    )
    .await
    .map_err(failed)?;
    if json {
        return print_json(&rows);
    }
    // Outbox messages the relay parked are the other half of what waits for
    // an operator: say so here too.
    let parked_outbox: i64 = crate::db::outbox::parked_counts(db)
        .await
        .map_err(failed)?
        .iter()
        .filter(|(name, _)| handler.is_none_or(|h| h == name.as_str()))
        .map(|(_, n)| n)
        .sum();
    if parked_outbox > 0 {
        println!("{parked_outbox} outbox messages are parked as undeliverable: see `inboxd outbox list`");
    }
    if rows.is_empty() {
        println!(
            "no dead letters{}",
            if all {
                ""
            } else {
                " parked (--all shows resolved ones)"
            }
        );
        return Ok(());
    }
    println!(
        "{:<6} {:<12} {:<36} {:<28} {:<18} {:>3} {:<20} REASON",
        "ID", "HANDLER", "EVENT ID", "RECORD", "KIND", "TRY", "LAST FAILURE"
    );
    for r in &rows {
        let record = format!("{}/{}@{}", r.topic, r.partition, r.offset);
        let kind = match &r.resolution {
            Some(resolution) => format!("{} ({resolution})", r.kind),
            None => r.kind.to_string(),
        };
        let reason: String = r.reason.chars().take(100).collect();
        println!(
            "{:<6} {:<12} {:<36} {:<28} {:<18} {:>3} {:<20} {reason}",
            r.id,
            r.handler,
            r.event_id.as_deref().unwrap_or("-"),
            record,
            kind,
            r.attempts,
            time(r.last_failed_at)
        );
    }
    Ok(())
}

async fn show(db: &Database, id: i64, json: bool) -> Result<(), CliError> {
    let row = fetch(db, &[id]).await?.remove(0);
    if json {
        return print_json(&row.detail_json());
    }
    println!("dead letter {}", row.id);
    println!(
        "  handler          {} (version {})",
        row.handler,
        row.handler_version.as_deref().unwrap_or("-")
    );
    println!(
        "  event id         {}",
        row.event_id
            .as_deref()
            .unwrap_or("- (none: it cannot be replayed)")
    );
    println!(
        "  record           {} partition {} offset {}",
        row.topic, row.partition, row.offset
    );
    println!("  reason           {}: {}", row.kind, row.reason);
    println!("  attempts         {}", row.attempts);
    println!(
        "  failed           first {}, last {}",
        time(row.first_failed_at),
        time(row.last_failed_at)
    );
    match (&row.resolution, row.resolved_at) {
        (Some(resolution), Some(at)) => println!("  resolved         {resolution} at {}", time(at)),
        _ => println!("  resolved         no (replay or discard it)"),
    }
    println!(
        "  key              {}",
        row.key.as_deref().map(bytes_text).unwrap_or_else(|| "-".into())
    );
    for (name, value) in &row.headers {
        println!("  header           {name}: {}", bytes_text(value));
    }
    println!(
        "  payload          {} bytes\n{}",
        row.payload.len(),
        bytes_text(&row.payload)
    );
    Ok(())
}

async fn replay_many(
    db: &Database,
    config: &Config,
    ids: &[i64],
    handler: Option<&str>,
    json: bool,
) -> Result<(), CliError> {
    let rows = match handler {
        Some(handler) => dead_letters::find(
            db,
            &Filter {
                handler: Some(handler),
                ..Filter::default()
            },
        )
        .await
        .map_err(failed)?,
        None => fetch(db, ids).await?,
    };
    let engine = WasmEngine::new(config.wasm.cache_dir())
        .map_err(|e| failed(format!("cannot start the WebAssembly engine: {e:#}")))?;
    let mut handlers: HashMap<String, HandlerComponent> = HashMap::new();
    let mut results = Vec::new();
    for row in &rows {
        if !handlers.contains_key(&row.handler) {
            let component = handler_for(db, &engine, config, row).await?;
            handlers.insert(row.handler.clone(), component);
        }
        let outcome = replay(db, &handlers[&row.handler], row).await.map_err(failed)?;
        results.push((row.id, outcome));
    }
    if json {
        let list: Vec<serde_json::Value> = results
            .iter()
            .map(|(id, outcome)| {
                let mut value = serde_json::to_value(outcome).unwrap_or_default();
                value["id"] = (*id).into();
                value
            })
            .collect();
        print_json(&list)?;
    } else {
        for (id, outcome) in &results {
            match outcome {
                ReplayOutcome::Replayed => println!("{id}: replayed"),
                ReplayOutcome::AlreadyApplied => {
                    println!("{id}: already applied by another replay; nothing to do")
                }
                ReplayOutcome::AlreadyResolved(how) => println!("{id}: already {how}; nothing to do"),
                ReplayOutcome::NoEventId => {
                    println!("{id}: has no event id, so it can never be deduplicated: discard it")
                }
                ReplayOutcome::Failed(reason) => println!("{id}: failed again, still parked: {reason}"),
            }
        }
        if results.is_empty() {
            println!("no parked dead letters to replay");
        }
    }
    let failures = results
        .iter()
        .filter(|(_, o)| matches!(o, ReplayOutcome::Failed(_) | ReplayOutcome::NoEventId))
        .count();
    if failures > 0 {
        return Err(CliError::Failed(format!(
            "{failures} of {} dead letters were not replayed; see `inboxd dlq show ID`",
            results.len()
        )));
    }
    Ok(())
}

/// The handler that replays a dead letter: the config's, else the uploaded active version.
async fn handler_for(
    db: &Database,
    engine: &WasmEngine,
    config: &Config,
    row: &Row,
) -> Result<HandlerComponent, CliError> {
    if let Some(handler_config) = config.handlers.iter().find(|h| h.name == row.handler) {
        return load_handler(db, engine, handler_config, None)
            .await
            .map_err(failed);
    }
    let Some(deployment) = store::deployment(db, &row.handler).await.map_err(failed)? else {
        return Err(CliError::Usage(format!(
            "dead letter {} belongs to handler {:?}, which is neither in the config nor uploaded: \
             add it to [[handlers]] or upload it to replay it",
            row.id, row.handler
        )));
    };
    let (_, component) = load_uploaded(db, engine, &row.handler, deployment.active_version)
        .await
        .map_err(failed)?;
    Ok(component)
}

async fn discard(db: &Database, ids: &[i64], json: bool) -> Result<(), CliError> {
    fetch(db, ids).await?;
    let mut results = Vec::new();
    for id in ids {
        let mut tx = db.begin().await.map_err(failed)?;
        let discarded = dead_letters::resolve(&mut tx, *id, "discarded")
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        results.push(serde_json::json!({ "id": id, "discarded": discarded }));
        if !json {
            if discarded {
                println!(
                    "{id}: discarded (its inbox row stays dead, so a redelivered copy is still skipped)"
                );
            } else {
                println!("{id}: already replayed or discarded; nothing to do");
            }
        }
    }
    if json {
        print_json(&results)?;
    }
    Ok(())
}
