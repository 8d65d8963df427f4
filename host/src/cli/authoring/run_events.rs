//! `inboxd test COMPONENT.wasm --migrations DIR --events events.jsonl
//! [--expect expected.json]`: a team's own events through the real pipeline,
//! with no broker.
//!
//! The handler is uploaded to a throwaway host ([`Scratch`]) as the API
//! would take it, and each partition's records run through
//! `Pipeline::process_batch`, the code a host runs on what it consumes:
//! claims, walls, limits, retries, dead letters and the outbox. What each
//! record came to is then read back from the database (a dead letter at its
//! offset: parked; the inbox row of its event id at its offset: applied;
//! otherwise a duplicate), with the outbox messages and the rows of the
//! handler's tables. Retries run at once unless `--backoff` is given, so a
//! test of a failing handler does not wait out real backoff.

use super::events::{self, TestRecord};
use super::expect::{Actual, Expected};
use super::scratch::{Refusal, Scratch, handler_name};
use crate::cli::handler_files::HandlerFiles;
use crate::cli::{CliError, failed};
use crate::db::dead_letters::{self, Filter, Row};
use crate::db::{offsets, snapshot};
use crate::metrics::Metrics;
use crate::pipeline::{BatchCursor, BatchEnd, Loaded, Pipeline, Slot};
use crate::record::Record;
use crate::stats::Stats;
use base64::Engine;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Rows of one table shown in the text report; `--json` has them all.
const SHOWN_ROWS: usize = 20;

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    #[command(flatten)]
    pub files: HandlerFiles,
    /// The handler's name (default: the component's file name).
    #[arg(long)]
    pub name: Option<String>,
    /// The events to deliver: one JSON object per line (see the handler guide).
    #[arg(long)]
    pub events: PathBuf,
    /// The end state to compare with; a difference exits 1.
    #[arg(long)]
    pub expect: Option<PathBuf>,
    /// Run on this database instead of a throwaway SQLite file.
    #[arg(long)]
    pub database: Option<String>,
    /// Wait out the handler's retry backoff between attempts, as a host does.
    #[arg(long)]
    pub backoff: bool,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What one record came to.
struct Settled<'a> {
    test: &'a TestRecord,
    event_id: Option<String>,
    outcome: &'static str,
    letter: Option<&'a Row>,
}

pub async fn test(args: TestArgs) -> Result<(), CliError> {
    let name = handler_name(args.name.as_deref(), &args.files)?;
    let expected = match &args.expect {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
            Some(Expected::parse(&text).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?)
        }
        None => None,
    };
    let scratch = Scratch::open(args.database.as_deref()).await?;
    let result = run(&args, &scratch, &name, expected.as_ref()).await;
    scratch.close().await;
    result
}

async fn run(
    args: &TestArgs,
    scratch: &Scratch,
    name: &str,
    expected: Option<&Expected>,
) -> Result<(), CliError> {
    let (config, component) = match scratch.deploy(name, &args.files).await {
        Ok(loaded) => loaded,
        Err(Refusal::Refused(message)) => return Err(CliError::Failed(format!("refused: {message}"))),
        Err(Refusal::Failed(error)) => return Err(error),
    };
    let db = &scratch.db;
    let mut tests = events::read(&args.events, &config.topics[0], &config.event_id)?;
    let mut retry = config.retry.clone();
    if !args.backoff {
        (retry.backoff_initial_ms, retry.backoff_max_ms) = (0, 0);
    }
    let loaded = Loaded {
        handler: Arc::new(component),
        event_id: config.event_id.clone(),
        retry,
        dedup: config.dedup.clone(),
    };
    let stats = Arc::new(Stats::new(Metrics::default().handler(name)));
    let pipeline = Pipeline::new(db.clone(), Slot::new(loaded), stats);

    // A database used before has positions: continue after them.
    let mut partitions: BTreeMap<(String, i32), Vec<usize>> = BTreeMap::new();
    for (i, t) in tests.iter().enumerate() {
        partitions
            .entry((t.record.topic.clone(), t.record.partition))
            .or_default()
            .push(i);
    }
    for ((topic, partition), indexes) in &partitions {
        let base = offsets::load(db, name, topic, *partition).await.map_err(failed)?;
        for &i in indexes {
            tests[i].record.offset += base.unwrap_or(0);
        }
    }
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    for ((topic, partition), indexes) in &partitions {
        let records: Vec<Record> = indexes.iter().map(|&i| tests[i].record.clone()).collect();
        let mut expected_offset = offsets::load(db, name, topic, *partition).await.map_err(failed)?;
        for (chunk, batch) in records
            .chunks(config.batch.max_events.max(1))
            .zip(indexes.chunks(config.batch.max_events.max(1)))
        {
            let mut cursor = BatchCursor::new(expected_offset);
            let end = pipeline.process_batch(chunk, &mut cursor, &shutdown).await;
            let at = tests[batch[0]].line;
            match end {
                Ok(BatchEnd::Done) => expected_offset = cursor.next_offset(),
                Ok(BatchEnd::Returned(_)) => {
                    unreachable!("a cursor with partition order runs its batch to the end")
                }
                Ok(BatchEnd::Fenced) => {
                    return Err(failed(format!(
                        "line {at}: another consumer moved {topic}/{partition} meanwhile: is a host \
                         running on this database?"
                    )));
                }
                Err(e) => return Err(failed(format!("line {at}: the pipeline failed: {e}"))),
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();

    let letters = dead_letters::find(
        db,
        &Filter {
            handler: Some(name),
            include_resolved: true,
            ..Filter::default()
        },
    )
    .await
    .map_err(failed)?;
    let inbox = snapshot::inbox(db, name).await.map_err(failed)?;
    let settled = settle(&tests, &config.event_id, &letters, &inbox);
    let outbox: Vec<Value> = snapshot::outbox(db, name)
        .await
        .map_err(failed)?
        .iter()
        .map(message_json)
        .collect();
    let tables: BTreeMap<String, Vec<Value>> = snapshot::tables(db, name)
        .await
        .map_err(failed)?
        .into_iter()
        .map(|t| (t.table, t.rows.into_iter().map(Value::Object).collect()))
        .collect();
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for s in &settled {
        *outcomes.entry(s.outcome.to_owned()).or_default() += 1;
    }
    let parked: Vec<Value> = settled.iter().filter_map(letter_json).collect();
    let differences = expected.map(|e| {
        e.compare(&Actual {
            outcomes: &outcomes,
            tables: &tables,
            outbox: &outbox,
            dead_letters: &parked,
        })
    });
    let rate = tests.len() as f64 / seconds.max(1e-9);

    if args.json {
        let body = json!({
            "handler": name,
            "records": settled.iter().map(record_json).collect::<Vec<_>>(),
            "outcomes": outcomes,
            "outbox": outbox,
            "tables": tables,
            "dead_letters": parked,
            "seconds": seconds,
            "records_per_second": rate.round(),
            "expect": differences.as_ref().map(|d| json!({ "ok": d.is_empty(), "differences": d })),
        });
        println!("{body}");
    } else {
        for s in &settled {
            println!("{}", record_line(s));
        }
        println!("outbox: {} messages", outbox.len());
        for m in &outbox {
            println!("  {m}");
        }
        for (table, rows) in &tables {
            println!("table {table}: {} rows", rows.len());
            for row in rows.iter().take(SHOWN_ROWS) {
                println!("  {row}");
            }
            if rows.len() > SHOWN_ROWS {
                println!(
                    "  ... and {} more (--json shows them all)",
                    rows.len() - SHOWN_ROWS
                );
            }
        }
        let counts: Vec<String> = outcomes.iter().map(|(k, v)| format!("{v} {k}")).collect();
        println!(
            "{} records in {seconds:.2} s ({rate:.0} records/s): {}",
            tests.len(),
            counts.join(", ")
        );
    }
    match differences {
        Some(d) if !d.is_empty() => {
            if !args.json {
                for diff in &d {
                    println!("differs: {diff}");
                }
            }
            Err(CliError::Failed(format!(
                "the end state differs from {} in {} place(s)",
                args.expect
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                d.len()
            )))
        }
        Some(_) => {
            if !args.json {
                println!("ok: the end state matches the expectation");
            }
            Ok(())
        }
        None => Ok(()),
    }
}

/// Each record's outcome, from what the database holds at its offset.
fn settle<'a>(
    tests: &'a [TestRecord],
    ids: &crate::config::EventIdConfig,
    letters: &'a [Row],
    inbox: &[snapshot::Claimed],
) -> Vec<Settled<'a>> {
    let parked: HashMap<(&str, i32, i64), &Row> = letters
        .iter()
        .map(|l| ((l.topic.as_str(), l.partition, l.offset), l))
        .collect();
    let claimed: HashMap<&str, &snapshot::Claimed> = inbox.iter().map(|c| (c.event_id.as_str(), c)).collect();
    tests
        .iter()
        .map(|test| {
            let r = &test.record;
            let event_id = crate::event_id::extract(ids, &r.headers, &r.payload).ok();
            let letter = parked.get(&(r.topic.as_str(), r.partition, r.offset)).copied();
            let applied = event_id
                .as_deref()
                .and_then(|id| claimed.get(id))
                .is_some_and(|c| {
                    c.status == "done"
                        && c.topic == r.topic
                        && c.partition == r.partition
                        && c.offset == r.offset
                });
            let outcome = match (letter, applied) {
                (Some(_), _) => "parked",
                (None, true) => "applied",
                (None, false) => "duplicate",
            };
            Settled {
                test,
                event_id: letter.and_then(|l| l.event_id.clone()).or(event_id),
                outcome,
                letter,
            }
        })
        .collect()
}

fn record_line(s: &Settled<'_>) -> String {
    let t = s.test;
    let copy = if t.copy > 1 {
        format!(" copy {}", t.copy)
    } else {
        String::new()
    };
    let id = s.event_id.as_deref().unwrap_or("(no event id)");
    let Some(l) = s.letter else {
        return format!("line {}{copy}: {} (event {id})", t.line, s.outcome);
    };
    let when = match l.attempts {
        0 => "before the handler ran".to_owned(),
        1 => "after 1 attempt".to_owned(),
        n => format!("after {n} attempts"),
    };
    format!(
        "line {}{copy}: parked as {} {when}: {} (event {id}, dead letter {})",
        t.line,
        l.kind.as_str(),
        l.reason,
        l.id
    )
}

fn record_json(s: &Settled<'_>) -> Value {
    let r = &s.test.record;
    json!({
        "line": s.test.line, "copy": s.test.copy, "event_id": s.event_id, "outcome": s.outcome,
        "topic": r.topic, "partition": r.partition, "offset": r.offset,
        "kind": s.letter.map(|l| l.kind.as_str()), "reason": s.letter.map(|l| l.reason.as_str()),
        "attempts": s.letter.map(|l| l.attempts),
    })
}

fn letter_json(s: &Settled<'_>) -> Option<Value> {
    let l = s.letter?;
    Some(json!({
        "id": l.id, "line": s.test.line, "copy": s.test.copy, "event_id": l.event_id,
        "kind": l.kind.as_str(), "reason": l.reason, "attempts": l.attempts,
        "topic": l.topic, "partition": l.partition, "offset": l.offset,
    }))
}

/// Bytes as a person reads them: JSON if they are JSON, else text, else base64.
fn bytes_json(bytes: &[u8]) -> Value {
    if let Ok(json) = serde_json::from_slice::<Value>(bytes) {
        return json;
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => text.into(),
        Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(bytes) }),
    }
}

fn message_json(m: &snapshot::Message) -> Value {
    let key = m.key.as_deref().map(|k| match std::str::from_utf8(k) {
        Ok(text) => Value::from(text),
        Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(k) }),
    });
    let headers: serde_json::Map<String, Value> = m
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), String::from_utf8_lossy(value).into_owned().into()))
        .collect();
    json!({ "topic": m.topic, "key": key, "payload": bytes_json(&m.payload), "headers": headers })
}
