//! `inboxd dlq`: inspect, replay and discard dead letters, one by one or a
//! group at a time (`dlq groups`: dead letters of one handler, kind and
//! reason pattern).
//!
//! Output is a readable table or block for people, and with `--json` one JSON
//! document for scripts. Every error says what was wrong and what to do.

use super::replay_report::Report;
use super::{CliError, failed, time};
use crate::config::{Config, DedupConfig};
use crate::db::Database;
use crate::db::dead_letter_groups;
use crate::db::dead_letters::{self, Filter, Row, bytes_text};
use crate::registry::load::load_handler;
use crate::registry::load::load_uploaded;
use crate::registry::store;
use crate::replay::{HeldChoice, ReplayOutcome, release_held, replay};
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
        /// At most this many, oldest first (a producer can park millions).
        #[arg(long, default_value_t = LIST_LIMIT)]
        limit: u32,
        /// Only those after this id (the next page).
        #[arg(long)]
        after: Option<i64>,
    },
    /// Parked dead letters grouped by handler, reason kind and reason pattern
    /// (numbers, ids and quoted values masked), the largest group first.
    Groups {
        #[arg(long)]
        handler: Option<String>,
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
        /// Every member of this group (an id from `inboxd dlq groups`).
        #[arg(long, conflicts_with_all = ["handler", "all"])]
        group: Option<String>,
        /// With `ordering = "key"`: the letters held behind each one
        /// replayed are replayed after it (the default) or discarded.
        #[arg(long, value_enum, default_value_t)]
        held: HeldChoice,
    },
    /// Mark dead letters as handled without running them (they stay for the record).
    Discard {
        ids: Vec<i64>,
        /// Every member of this group (an id from `inboxd dlq groups`).
        #[arg(long)]
        group: Option<String>,
        /// With `ordering = "key"`: the letters held behind each one
        /// discarded are replayed (the default) or discarded with it.
        #[arg(long, value_enum, default_value_t)]
        held: HeldChoice,
    },
}

/// The members of a group of parked dead letters, failing with what to do
/// when there is none with that id.
/// Members of a group one `--group` run replays or discards, at most.
const GROUP_PAGE: usize = 10_000;

async fn group_members(db: &Database, id: &str) -> Result<Vec<i64>, CliError> {
    let group = dead_letter_groups::group(db, &Filter::default(), id)
        .await
        .map_err(failed)?;
    match group {
        // A page of it: each member is read and written on its own, and a
        // producer can park millions of letters for nothing (the
        // twenty-sixth read: all of them were one list of ids in one query).
        Some(mut group) => {
            if group.members.len() > GROUP_PAGE {
                eprintln!(
                    "group {id} has {} members: this run takes its oldest {GROUP_PAGE}; run it again for the rest",
                    group.members.len()
                );
                group.members.truncate(GROUP_PAGE);
            }
            Ok(group.members)
        }
        None => Err(CliError::Usage(format!(
            "no group of parked dead letters with id {id}: run `inboxd dlq groups` to see them \
             (a group whose members were all replayed or discarded is gone)"
        ))),
    }
}

fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    println!("{}", serde_json::to_string_pretty(value).map_err(failed)?);
    Ok(())
}

/// Fetches the named dead letters, failing with the ids that do not exist.
async fn fetch(db: &Database, ids: &[i64]) -> Result<Vec<Row>, CliError> {
    fetch_rows(db, ids, false).await
}

/// [`fetch`], with or without the records (key, payload, headers).
async fn fetch_rows(db: &Database, ids: &[i64], without_record: bool) -> Result<Vec<Row>, CliError> {
    let rows = dead_letters::find(
        db,
        &Filter {
            ids: Some(ids),
            include_resolved: true,
            without_record,
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
        DlqCommand::List {
            handler,
            all,
            limit,
            after,
        } => {
            let page = Page {
                limit: *limit,
                after: *after,
            };
            list(&db, handler.as_deref(), *all, page, args.json).await
        }
        DlqCommand::Groups { handler } => groups(&db, handler.as_deref(), args.json).await,
        DlqCommand::Show { id } => show(&db, *id, args.json).await,
        DlqCommand::Replay {
            ids,
            handler,
            all,
            group,
            held,
        } => {
            let ways = [!ids.is_empty(), *all, group.is_some()];
            if ways.into_iter().filter(|way| *way).count() != 1 {
                return Err(CliError::Usage(
                    "name the dead letter ids to replay, or use --handler NAME --all, or --group ID \
                     (one of them)"
                        .into(),
                ));
            }
            match group {
                Some(group) => match group_members(&db, group).await {
                    Ok(members) => replay_many(&db, &config, &members, None, *held, args.json).await,
                    Err(e) => Err(e),
                },
                None => replay_many(&db, &config, ids, handler.as_deref(), *held, args.json).await,
            }
        }
        DlqCommand::Discard { ids, group, held } => match (ids.is_empty(), group) {
            (false, None) => discard(&db, &config, ids, *held, args.json).await,
            (true, Some(group)) => match group_members(&db, group).await {
                Ok(members) => discard(&db, &config, &members, *held, args.json).await,
                Err(e) => Err(e),
            },
            _ => Err(CliError::Usage(
                "name the dead letter ids to discard, or --group ID (one of them)".into(),
            )),
        },
    };
    db.close().await;
    result
}

/// What `dlq list` shows by default, at most.
const LIST_LIMIT: u32 = 1_000;

/// One page of `dlq list`.
#[derive(Clone, Copy)]
struct Page {
    limit: u32,
    after: Option<i64>,
}

async fn list(
    db: &Database,
    handler: Option<&str>,
    all: bool,
    page: Page,
    json: bool,
) -> Result<(), CliError> {
    // A list shows no records (reading them held every payload at once),
    // and at most a page of letters: a producer can park millions for
    // nothing, and all of them at once were gigabytes (the twenty-sixth read).
    let rows = dead_letters::find(
        db,
        &Filter {
            handler,
            include_resolved: all,
            without_record: true,
            limit: Some(page.limit.max(1)),
            after_id: page.after,
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
        let reason = cell(&r.reason.chars().take(100).collect::<String>()).into_owned();
        println!(
            "{:<6} {:<12} {:<36} {:<28} {:<18} {:>3} {:<20} {reason}",
            r.id,
            r.handler,
            cell(r.event_id.as_deref().unwrap_or("-")),
            cell(&record),
            kind,
            r.attempts,
            time(r.last_failed_at)
        );
    }
    if let Some(last) = rows.last().filter(|_| rows.len() >= page.limit.max(1) as usize) {
        println!(
            "the first {} shown: `inboxd dlq list --after {}` for the next ones",
            rows.len(),
            last.id
        );
    }
    Ok(())
}

async fn groups(db: &Database, handler: Option<&str>, json: bool) -> Result<(), CliError> {
    let filter = Filter {
        handler,
        ..Filter::default()
    };
    let groups = dead_letter_groups::groups(db, &filter).await.map_err(failed)?;
    if json {
        return print_json(&groups);
    }
    if groups.is_empty() {
        println!("no dead letters parked");
        return Ok(());
    }
    println!(
        "{:<16} {:<12} {:<18} {:>6} {:<20} {:<20} PATTERN",
        "GROUP", "HANDLER", "KIND", "COUNT", "FIRST FAILURE", "LAST FAILURE"
    );
    for g in &groups {
        let pattern = cell(&g.pattern.chars().take(100).collect::<String>()).into_owned();
        println!(
            "{:<16} {:<12} {:<18} {:>6} {:<20} {:<20} {pattern}",
            g.id,
            g.handler,
            g.kind.as_str(),
            g.count,
            time(g.first_failed_at),
            time(g.last_failed_at)
        );
    }
    println!(
        "replay or discard a group with `inboxd dlq replay --group ID` or `inboxd dlq discard --group ID`"
    );
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
        terminal(
            row.event_id
                .as_deref()
                .unwrap_or("- (none: it cannot be replayed)")
        )
    );
    println!(
        "  record           {} partition {} offset {}",
        row.topic, row.partition, row.offset
    );
    println!("  reason           {}: {}", row.kind, cell(&row.reason));
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
        terminal(&row.key.as_deref().map(bytes_text).unwrap_or_else(|| "-".into()))
    );
    for (name, value) in &row.headers {
        println!(
            "  header           {}: {}",
            terminal(name),
            terminal(&bytes_text(value))
        );
    }
    println!(
        "  payload          {} bytes\n{}",
        row.payload.len(),
        terminal(&bytes_text(&row.payload))
    );
    Ok(())
}

/// Dead letters read with their records at a time, when replaying many: one
/// (see the admin API's `REPLAY_CHUNK`).
const REPLAY_CHUNK: usize = 1;

/// Parked ids read at a time for `--handler H --all`: a handler may have
/// millions, and none is kept once replayed.
const IDS_PAGE: u32 = 1_000;

/// Replays `ids`, or with `handler` every parked letter of it (read a page
/// of ids at a time), printing each outcome as it comes.
async fn replay_many(
    db: &Database,
    config: &Config,
    ids: &[i64],
    handler: Option<&str>,
    held: HeldChoice,
    json: bool,
) -> Result<(), CliError> {
    if handler.is_none() {
        // Every id must exist before any is replayed.
        fetch_rows(db, ids, true).await?;
    }
    let engine = WasmEngine::new(&config.wasm)
        .map_err(|e| failed(format!("cannot start the WebAssembly engine: {e:#}")))?;
    let mut handlers: HashMap<String, (HandlerComponent, Option<DedupConfig>)> = HashMap::new();
    let mut report = Report::start(json);
    let (mut page, mut after) = (ids.to_vec(), None);
    loop {
        if let Some(handler) = handler {
            page = dead_letters::parked_ids(db, handler, after, IDS_PAGE)
                .await
                .map_err(failed)?;
            after = page.last().copied();
        }
        // Records are read a chunk at a time: a handler's 5,000 dead letters
        // are never 5,000 payloads in memory at once.
        for chunk in page.chunks(REPLAY_CHUNK) {
            for row in &fetch(db, chunk).await? {
                if !handlers.contains_key(&row.handler) {
                    let component = handler_for(db, &engine, config, row).await?;
                    handlers.insert(row.handler.clone(), component);
                }
                let (component, dedup) = &handlers[&row.handler];
                // A host failure on one (the database, say) is that one's
                // outcome: the others still run, and every one is reported.
                let outcome = replay(db, component, dedup.as_ref(), row)
                    .await
                    .map_err(|e| e.to_string());
                report.push(row.id, &outcome);
                if matches!(&outcome, Ok(o) if o.resolved_here()) {
                    for (id, outcome) in released(db, component, dedup.as_ref(), row, held).await {
                        report.push(id, &outcome);
                    }
                }
            }
        }
        if handler.is_none() || page.len() < IDS_PAGE as usize {
            return report.finish();
        }
    }
}

/// The handler that replays a dead letter, with its business-key dedup: the
/// config's, else the uploaded active version.
async fn handler_for(
    db: &Database,
    engine: &WasmEngine,
    config: &Config,
    row: &Row,
) -> Result<(HandlerComponent, Option<DedupConfig>), CliError> {
    if let Some(handler_config) = config.handlers.iter().find(|h| h.name == row.handler) {
        let component = load_handler(db, engine, handler_config, None)
            .await
            .map_err(failed)?;
        return Ok((component, handler_config.dedup.clone()));
    }
    let Some(deployment) = store::deployment(db, &row.handler).await.map_err(failed)? else {
        return Err(CliError::Usage(format!(
            "dead letter {} belongs to handler {:?}, which is neither in the config nor uploaded: \
             add it to [[handlers]] or upload it to replay it",
            row.id, row.handler
        )));
    };
    let (settings, component) = load_uploaded(db, engine, &row.handler, deployment.active_version)
        .await
        .map_err(failed)?;
    Ok((component, settings.dedup))
}

/// The letters held behind `row`, released as the operator chose; a host
/// failure is the outcome of the first not released.
async fn released(
    db: &Database,
    component: &HandlerComponent,
    dedup: Option<&DedupConfig>,
    row: &Row,
    held: HeldChoice,
) -> Vec<(i64, Result<ReplayOutcome, String>)> {
    match release_held(db, component, dedup, row, held).await {
        Ok(list) => list.into_iter().map(|(id, o)| (id, Ok(o))).collect(),
        Err(error) => vec![(row.id, Err(format!("releasing its held letters: {error}")))],
    }
}

async fn discard(
    db: &Database,
    config: &Config,
    ids: &[i64],
    held: HeldChoice,
    json: bool,
) -> Result<(), CliError> {
    // With their keys, to find what is held behind them (not their records:
    // a group may be thousands of letters of a megabyte).
    let rows = dead_letters::find(
        db,
        &Filter {
            ids: Some(ids),
            include_resolved: true,
            without_record: true,
            keep_key: true,
            ..Filter::default()
        },
    )
    .await
    .map_err(failed)?;
    if let Some(missing) = ids.iter().find(|id| !rows.iter().any(|r| r.id == **id)) {
        return Err(CliError::Usage(format!(
            "no dead letter with id {missing}: run `inboxd dlq list --all` to see the ids"
        )));
    }
    let mut results = Vec::new();
    // All of them first, then what each held: a letter held behind one of
    // them that is itself to be discarded is discarded, never replayed.
    let mut resolved = Vec::new();
    for row in &rows {
        let id = row.id;
        let mut tx = db.begin().await.map_err(failed)?;
        let discarded = dead_letters::resolve(&mut tx, id, "discarded")
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
        // Only the call that resolved a letter releases what it held.
        if discarded {
            resolved.push(row);
        }
    }
    let mut engine = None;
    for row in resolved {
        // With key order, the letters held behind it go now, as chosen.
        if row.key.is_none()
            || dead_letters::held_behind(db, row, 1)
                .await
                .map_err(failed)?
                .is_empty()
        {
            continue;
        }
        if engine.is_none() {
            let started = WasmEngine::new(&config.wasm)
                .map_err(|e| failed(format!("cannot start the WebAssembly engine: {e:#}")))?;
            engine = Some(started);
        }
        let engine = engine.as_ref().expect("started above");
        let (component, dedup) = handler_for(db, engine, config, row).await?;
        let id = row.id;
        for (held_id, outcome) in released(db, &component, dedup.as_ref(), row, held).await {
            let mut value = match &outcome {
                Ok(outcome) => serde_json::to_value(outcome).unwrap_or_default(),
                Err(error) => serde_json::json!({ "outcome": "error", "detail": error }),
            };
            if !json {
                println!("{held_id}: held behind {id}: {value}");
            }
            value["id"] = held_id.into();
            results.push(value);
        }
    }
    if json {
        print_json(&results)?;
    }
    Ok(())
}

/// `text` as a terminal may show it: every control character but a line
/// break or a tab written as `\u{..}`. A reason is a guest's own text and a
/// header name a producer's: escape sequences in them cleared or redrew the
/// operator's screen, and on some terminals wrote the clipboard (the
/// twenty-sixth read).
fn terminal(text: &str) -> std::borrow::Cow<'_, str> {
    shown(text, |c| c == '\n' || c == '\t')
}

/// `text` in one cell of a table: as [`terminal`], line breaks and tabs
/// escaped too (a reason could print lines that looked like other letters'
/// rows: the twenty-seventh read).
fn cell(text: &str) -> std::borrow::Cow<'_, str> {
    shown(text, |_| false)
}

fn shown(text: &str, kept: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    // Control characters, and the invisible ones that reorder or hide text
    // (bidirectional overrides and isolates, zero-width characters).
    let hidden = |c: char| {
        !kept(c)
            && (c.is_control()
                || matches!(c, '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}'))
    };
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| match hidden(c) {
                true => c.escape_unicode().to_string(),
                false => c.to_string(),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::{cell, terminal};

    /// Regression (the twenty-sixth read): escape sequences in a reason or a
    /// header reached the operator's terminal.
    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(terminal("plain text\twith a tab\n"), "plain text\twith a tab\n");
        assert_eq!(terminal("\u{1b}[2Jgone\r"), "\\u{1b}[2Jgone\\u{d}");
        assert_eq!(
            terminal("\u{1b}]52;c;ZXZpbA==\u{7}"),
            "\\u{1b}]52;c;ZXZpbA==\\u{7}"
        );
        // In a table's cell, line breaks and tabs too, and what reorders text.
        assert_eq!(cell("a\nb\tc"), "a\\u{a}b\\u{9}c");
        assert_eq!(cell("x\u{202e}y"), "x\\u{202e}y");
    }
}
