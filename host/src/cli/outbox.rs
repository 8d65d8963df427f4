//! `inboxd outbox`: inspect, re-queue and discard outbox messages the relay
//! parked because the broker will never accept them (an invalid topic name,
//! a message over the size limit, a topic the relay may not write).
//!
//! Like `inboxd dlq`, it works on the database named in the config, so it
//! needs no running host; the admin API offers the same under
//! `/v1/handlers/{name}/outbox/parked`. Re-queueing does not change the
//! message: fix its cause first (the handler's `outbox_topics`, the topic's
//! ACLs or size limit), or it is parked again.

use super::{CliError, failed, time};
use crate::config::Config;
use crate::db::Database;
use crate::db::outbox::{self, Parked, ParkedFilter};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct OutboxArgs {
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
    pub command: OutboxCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum OutboxCommand {
    /// Parked messages, oldest first (with --all, also discarded ones).
    List {
        #[arg(long)]
        handler: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// One parked message in full: topic, key, headers, payload, reason.
    Show { seq: i64 },
    /// Put parked messages back in line: the relay sends them next.
    Retry {
        /// Message seqs (as `list` shows them).
        seqs: Vec<i64>,
        /// With --all: every parked message of this handler.
        #[arg(long)]
        handler: Option<String>,
        #[arg(long, requires = "handler")]
        all: bool,
    },
    /// Mark parked messages as handled without sending them (they stay for the record).
    Discard {
        #[arg(required = true)]
        seqs: Vec<i64>,
    },
}

fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    println!("{}", serde_json::to_string_pretty(value).map_err(failed)?);
    Ok(())
}

/// The named parked messages (discarded ones too), failing with the seqs
/// that are not parked. Key, payload and headers only `with_record` (for
/// `show`, one message): retrying or discarding needs none of them.
async fn fetch(db: &Database, seqs: &[i64], with_record: bool) -> Result<Vec<Parked>, CliError> {
    let filter = ParkedFilter {
        seqs: Some(seqs),
        include_discarded: true,
        without_record: !with_record,
        ..ParkedFilter::default()
    };
    let rows = outbox::parked(db, &filter).await.map_err(failed)?;
    let missing: Vec<String> = seqs
        .iter()
        .filter(|seq| !rows.iter().any(|r| r.seq == **seq))
        .map(i64::to_string)
        .collect();
    if !missing.is_empty() {
        return Err(CliError::Usage(format!(
            "no parked outbox message with seq {}: run `inboxd outbox list --all` to see them",
            missing.join(", ")
        )));
    }
    Ok(rows)
}

pub async fn run(args: OutboxArgs) -> Result<(), CliError> {
    let config = Config::load(&args.config).map_err(|e| CliError::Usage(e.to_string()))?;
    let db = crate::db::open(&config).await.map_err(failed)?;
    let result = match &args.command {
        OutboxCommand::List { handler, all } => list(&db, handler.as_deref(), *all, args.json).await,
        OutboxCommand::Show { seq } => show(&db, *seq, args.json).await,
        OutboxCommand::Retry { seqs, handler, all } => {
            if seqs.is_empty() != *all {
                return Err(CliError::Usage(
                    "name the message seqs to retry, or use --handler NAME --all (not both)".into(),
                ));
            }
            retry(&db, seqs, handler.as_deref().filter(|_| *all), args.json).await
        }
        OutboxCommand::Discard { seqs } => discard(&db, seqs, args.json).await,
    };
    db.close().await;
    result
}

async fn list(db: &Database, handler: Option<&str>, all: bool, json: bool) -> Result<(), CliError> {
    let filter = ParkedFilter {
        handler,
        include_discarded: all,
        without_record: true,
        ..ParkedFilter::default()
    };
    let rows = outbox::parked(db, &filter).await.map_err(failed)?;
    if json {
        return print_json(&rows);
    }
    if rows.is_empty() {
        println!("no outbox messages parked");
        return Ok(());
    }
    println!(
        "{:<8} {:<12} {:<36} {:<28} {:>3} {:<20} REASON",
        "SEQ", "HANDLER", "MESSAGE ID", "TOPIC", "TRY", "PARKED"
    );
    for r in &rows {
        let parked = match r.discarded_at {
            Some(_) => format!("{} (discarded)", time(r.parked_at)),
            None => time(r.parked_at),
        };
        let reason: String = r.reason.as_deref().unwrap_or("-").chars().take(100).collect();
        println!(
            "{:<8} {:<12} {:<36} {:<28} {:>3} {:<20} {reason}",
            r.seq, r.handler, r.id, r.topic, r.attempts, parked
        );
    }
    Ok(())
}

async fn show(db: &Database, seq: i64, json: bool) -> Result<(), CliError> {
    let row = fetch(db, &[seq], true).await?.remove(0);
    let detail = row.detail_json();
    if json {
        return print_json(&detail);
    }
    println!("parked outbox message {}", row.seq);
    println!("  handler          {}", row.handler);
    println!("  message id       {}", row.id);
    println!("  topic            {}", row.topic);
    println!("  reason           {}", row.reason.as_deref().unwrap_or("-"));
    println!("  attempts         {}", row.attempts);
    println!(
        "  created, parked  {}, {}",
        time(row.created_at),
        time(row.parked_at)
    );
    match row.discarded_at {
        Some(at) => println!("  discarded        at {}", time(at)),
        None => println!("  discarded        no (retry or discard it)"),
    }
    println!("  key              {}", detail["key"]);
    for header in detail["headers"].as_array().into_iter().flatten() {
        println!(
            "  header           {}: {}",
            header["name"].as_str().unwrap_or(""),
            header["value"]
        );
    }
    println!(
        "  payload          {} bytes\n{}",
        row.payload.len(),
        detail["payload"]
    );
    Ok(())
}

async fn retry(db: &Database, seqs: &[i64], all_of: Option<&str>, json: bool) -> Result<(), CliError> {
    if let Some(handler) = all_of {
        // A count, not the seqs: a handler may have millions parked.
        let count = outbox::requeue_all(db, handler).await.map_err(failed)?;
        if json {
            return print_json(&serde_json::json!({ "requeued": count }));
        }
        match count {
            0 => println!("no parked outbox messages to retry"),
            n => println!("{n} outbox messages re-queued; the relay sends them next in their buckets"),
        }
        return Ok(());
    }
    let mut requeued = Vec::new();
    for row in fetch(db, seqs, false).await? {
        requeued.extend(
            outbox::requeue(db, &row.handler, &[row.seq])
                .await
                .map_err(failed)?,
        );
    }
    if json {
        return print_json(&serde_json::json!({ "requeued": requeued }));
    }
    for seq in seqs {
        if !requeued.contains(seq) {
            println!("{seq}: discarded or no longer parked; nothing to do");
        }
    }
    println!(
        "{} outbox messages re-queued; the relay sends them next in their buckets",
        requeued.len()
    );
    Ok(())
}

async fn discard(db: &Database, seqs: &[i64], json: bool) -> Result<(), CliError> {
    let mut results = Vec::new();
    for row in fetch(db, seqs, false).await? {
        let discarded = outbox::discard(db, &row.handler, row.seq).await.map_err(failed)?;
        results.push(serde_json::json!({ "seq": row.seq, "discarded": discarded }));
        if !json {
            if discarded {
                println!(
                    "{}: discarded (kept for the record until outbox.retention)",
                    row.seq
                );
            } else {
                println!("{}: already discarded; nothing to do", row.seq);
            }
        }
    }
    if json {
        print_json(&results)?;
    }
    Ok(())
}
