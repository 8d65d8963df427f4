//! `inboxd demo`: the newcomer's first command.
//!
//! With nothing but the repository it starts librdkafka's in-process mock
//! broker, an SQLite file and the billing guest, produces order events with a
//! share of them re-sent (as producer retries and redeliveries do, some before
//! and some after a consumer restart), runs them through the real pipeline, and
//! prints what happened. The last stdout line is one JSON object for scripts.

use super::{CliError, failed};
use crate::config::{Config, DatabaseConfig, HandlerConfig, KafkaConfig, is_identifier};
use crate::db::redact_url;
use crate::db::{Database, dead_letters, offsets};
use crate::host::Host;
use crate::stats::Snapshot;
use rand::Rng;
use rand::seq::IndexedRandom;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "orders.confirmed";
/// How long one phase may take to be fully consumed before the demo gives up.
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(180);
const BILLING_WASM: &str = "guests/target/wasm32-wasip2/release/billing.wasm";
const BILLING_MIGRATIONS: &str = "guests/billing/migrations";
/// The second step of the chain: billing's `invoices.created` -> one email row each.
const INVOICES: &str = "invoices.created";
const NOTIFIER_WASM: &str = "guests/target/wasm32-wasip2/release/notifier.wasm";
const NOTIFIER_MIGRATIONS: &str = "guests/notifier/migrations";

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Unique order events to produce.
    #[arg(long, default_value_t = 1000)]
    pub events: usize,
    /// Extra copies to re-send, as a share of --events (0.2 = 20% more sends).
    #[arg(long, default_value_t = 0.2)]
    pub duplicate_rate: f64,
    /// Partitions of the demo topic.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Run this handler component instead of the billing guest.
    #[arg(long, requires = "effects_table")]
    pub handler: Option<PathBuf>,
    /// The --handler's migrations folder.
    #[arg(long, requires = "handler")]
    pub migrations: Option<PathBuf>,
    /// The table whose rows count as the --handler's effects.
    #[arg(long, requires = "handler")]
    pub effects_table: Option<String>,
    /// Database URL (default: a new SQLite file in a temporary folder).
    #[arg(long)]
    pub database: Option<String>,
}

/// One order, sent once or several times.
struct Order {
    event_id: String,
    order_id: String,
    payload: Vec<u8>,
}

fn usage(message: impl Into<String>) -> CliError {
    CliError::Usage(message.into())
}

/// Finds a repository file from the working directory, else from the source tree
/// this binary was built from.
fn repo_path(relative: &str) -> PathBuf {
    let here = PathBuf::from(relative);
    if here.exists() {
        return here;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(relative)
}

fn build_config(args: &DemoArgs, brokers: String) -> Result<(Config, String), CliError> {
    let (name, component, migrations, table) = match &args.handler {
        Some(path) => {
            let table = args.effects_table.clone().unwrap_or_default();
            if !is_identifier(&table) {
                return Err(usage(format!(
                    "--effects-table {table:?} must be a plain table name (a-z, 0-9, _)"
                )));
            }
            ("demo".to_owned(), path.clone(), args.migrations.clone(), table)
        }
        None => {
            let wasm = repo_path(BILLING_WASM);
            if !wasm.is_file() {
                return Err(usage(format!(
                    "the billing guest is not built ({} is missing): run scripts/demo, or \
                     `cargo build --release --target wasm32-wasip2 --manifest-path guests/Cargo.toml`",
                    wasm.display()
                )));
            }
            (
                "billing".to_owned(),
                wasm,
                Some(repo_path(BILLING_MIGRATIONS)),
                "invoices".to_owned(),
            )
        }
    };
    let database = match &args.database {
        Some(url) => url.clone(),
        None => {
            let dir = tempfile::Builder::new()
                .prefix("inboxd-demo-")
                .tempdir()
                .map_err(failed)?
                .keep();
            format!("sqlite://{}", dir.join("demo.sqlite").display())
        }
    };
    let mut handler: HandlerConfig = toml::from_str(&format!(
        "name = {name:?}\ncomponent = \"\"\ntopics = [{TOPIC:?}]"
    ))
    .map_err(failed)?;
    handler.component = component;
    handler.migrations = migrations;
    if args.handler.is_none() {
        // billing publishes `invoices.created`; a handler may publish only to
        // the topics its mapping names (here the same name on the mock broker).
        handler
            .outbox_topics
            .insert(INVOICES.to_owned(), INVOICES.to_owned());
    }
    let mut handlers = vec![handler];
    if args.handler.is_none() {
        let wasm = repo_path(NOTIFIER_WASM);
        if !wasm.is_file() {
            return Err(usage(format!(
                "the notifier guest is not built ({} is missing): run scripts/demo",
                wasm.display()
            )));
        }
        let mut notifier: HandlerConfig = toml::from_str(&format!(
            "name = \"notifier\"\ncomponent = \"\"\ntopics = [{INVOICES:?}]"
        ))
        .map_err(failed)?;
        notifier.component = wasm;
        notifier.migrations = Some(repo_path(NOTIFIER_MIGRATIONS));
        handlers.push(notifier);
    }
    let config = Config {
        admin: None,
        telemetry: Default::default(),
        database: DatabaseConfig {
            url: database,
            ..DatabaseConfig::default()
        },
        // The mock broker notices a departed consumer quickly; keep the restart snappy.
        inbox: Default::default(),
        outbox: Default::default(),
        wasm: Default::default(),
        kafka: KafkaConfig {
            brokers,
            session_timeout_ms: 6_000,
            properties: Default::default(),
        },
        handlers,
    };
    config.validate().map_err(|e| usage(e.to_string()))?;
    Ok((config, table))
}

fn make_orders(count: usize) -> Vec<Order> {
    let mut rng = rand::rng();
    (0..count)
        .map(|i| {
            let event_id = uuid::Uuid::new_v4().to_string();
            let order_id = format!("order-{i:06}");
            let payload = serde_json::json!({
                "event_id": event_id,
                "order_id": order_id,
                "customer_email": format!("customer{}@example.com", i % 97),
                "amount_cents": rng.random_range(100..100_000),
            });
            Order {
                event_id,
                order_id,
                payload: payload.to_string().into_bytes(),
            }
        })
        .collect()
}

/// Sends each order; returns the next offset per partition after the sends.
async fn send(
    producer: &FutureProducer,
    orders: &[&Order],
    ends: &mut HashMap<i32, i64>,
) -> Result<(), CliError> {
    for order in orders {
        let headers = OwnedHeaders::new().insert(Header {
            key: "event_id",
            value: Some(order.event_id.as_bytes()),
        });
        let record = FutureRecord::to(TOPIC)
            .key(&order.order_id)
            .payload(&order.payload)
            .headers(headers);
        let delivery = producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| failed(format!("producing to the demo broker failed: {e}")))?;
        let end = ends.entry(delivery.partition).or_insert(0);
        *end = (*end).max(delivery.offset + 1);
    }
    Ok(())
}

/// The demo counts rows to prove exactly-once, so it needs a database where
/// the handler has no rows and no stored offsets yet.
async fn ensure_empty(config: &Config, table: &str) -> Result<(), CliError> {
    let db = crate::db::open(config).await.map_err(failed)?;
    let handler = &config.handlers[0].name;
    let qualified = db.handler_table(handler, table);
    let rows = db
        .query_i64(&format!("SELECT COUNT(*) FROM {qualified}"), &[])
        .await
        .map_err(|e| {
            usage(format!(
                "--effects-table {table}: cannot count its rows ({e}); do the migrations create it?"
            ))
        })?;
    let positions = offsets::load_all(&db, handler).await.map_err(failed)?.len();
    db.close().await;
    if rows > 0 || positions > 0 {
        return Err(usage(format!(
            "the demo needs an empty database, but {qualified} has {rows} rows and handler {handler} has \
             {positions} stored offsets: pass a fresh --database (or leave it out for a new SQLite file)"
        )));
    }
    Ok(())
}

/// Runs a host until its stored offsets reach `ends`, then drains it.
async fn consume_until(config: &Config, ends: &HashMap<i32, i64>) -> Result<Snapshot, CliError> {
    let host = Host::start(config).await.map_err(failed)?;
    let handler = &config.handlers[0].name;
    let stats = host.stats()[handler].clone();
    let db = host.database().clone();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(host.run(shutdown.clone()));
    let mut caught_up = wait_for_offsets(&db, handler, ends).await;
    if caught_up.is_ok() && config.handlers.len() > 1 {
        caught_up = wait_for_emails(&db).await;
    }
    shutdown.cancel();
    running.await.map_err(failed)?;
    caught_up?;
    Ok(stats.snapshot())
}

/// Waits until the relay has sent every invoice and notifier has emailed each.
async fn wait_for_emails(db: &Database) -> Result<(), CliError> {
    let started = Instant::now();
    let (invoices, emails) = (
        db.handler_table("billing", "invoices"),
        db.handler_table("notifier", "emails"),
    );
    loop {
        let (backlog, _) = crate::db::outbox::backlog(db, "billing").await.map_err(failed)?;
        let invoiced = db
            .query_i64(&format!("SELECT COUNT(*) FROM {invoices}"), &[])
            .await
            .map_err(failed)?;
        let emailed = db
            .query_i64(&format!("SELECT COUNT(*) FROM {emails}"), &[])
            .await
            .map_err(failed)?;
        if backlog == 0 && emailed >= invoiced {
            return Ok(());
        }
        if started.elapsed() > CATCH_UP_DEADLINE {
            return Err(failed(format!(
                "the chain did not catch up within {} s: {invoiced} invoices, {emailed} emails, outbox backlog {backlog}",
                CATCH_UP_DEADLINE.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_offsets(db: &Database, handler: &str, ends: &HashMap<i32, i64>) -> Result<(), CliError> {
    let started = Instant::now();
    loop {
        let stored: HashMap<i32, i64> = offsets::load_all(db, handler)
            .await
            .map_err(failed)?
            .into_iter()
            .filter(|position| position.topic == TOPIC)
            .map(|position| (position.partition, position.next_offset))
            .collect();
        if ends
            .iter()
            .all(|(p, end)| stored.get(p).is_some_and(|n| n >= end))
        {
            return Ok(());
        }
        if started.elapsed() > CATCH_UP_DEADLINE {
            return Err(failed(format!(
                "the host did not catch up within {} s: stored offsets {stored:?}, produced up to {ends:?}",
                CATCH_UP_DEADLINE.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn demo(args: DemoArgs) -> Result<(), CliError> {
    if args.events == 0 {
        return Err(usage("--events must be at least 1"));
    }
    if !(0.0..=1.0).contains(&args.duplicate_rate) {
        return Err(usage(format!(
            "--duplicate-rate must be between 0 and 1, got {}",
            args.duplicate_rate
        )));
    }
    if !(1..=64).contains(&args.partitions) {
        return Err(usage("--partitions must be between 1 and 64"));
    }
    let cluster = MockCluster::new(1).map_err(|e| failed(format!("cannot start the mock broker: {e}")))?;
    cluster
        .create_topic(TOPIC, args.partitions, 1)
        .map_err(|e| failed(format!("cannot create the demo topic: {e}")))?;
    cluster
        .create_topic(INVOICES, args.partitions, 1)
        .map_err(|e| failed(format!("cannot create the demo topic: {e}")))?;
    let (config, table) = build_config(&args, cluster.bootstrap_servers())?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("enable.idempotence", "true")
        .create()
        .map_err(failed)?;

    let orders = make_orders(args.events);
    let duplicates = (args.events as f64 * args.duplicate_rate).round() as usize;
    let half = orders.len().div_ceil(2);
    let mut rng = rand::rng();
    // Phase 1: the first half, with re-sends of some of them (producer retries).
    let mut phase1: Vec<&Order> = orders[..half].iter().collect();
    phase1.extend((0..duplicates / 2).filter_map(|_| orders[..half].choose(&mut rng)));
    // Phase 2, after the consumer restarts: the rest, with re-sends of any order,
    // including ones the first consumer already applied (redelivery, replay).
    let mut phase2: Vec<&Order> = orders[half..].iter().collect();
    phase2.extend((0..duplicates - duplicates / 2).filter_map(|_| orders.choose(&mut rng)));

    ensure_empty(&config, &table).await?;
    println!(
        "Inboxd demo: {} order events, {duplicates} re-sent copies, {} partitions",
        args.events, args.partitions
    );
    println!("database: {}", redact_url(&config.database.url));
    let started = Instant::now();
    let mut ends = HashMap::new();
    send(&producer, &phase1, &mut ends).await?;
    println!("phase 1: sent {} records; consuming...", phase1.len());
    let first = consume_until(&config, &ends).await?;
    println!(
        "phase 1: applied {}, skipped {} duplicates; consumer stopped",
        first.applied, first.duplicates
    );
    send(&producer, &phase2, &mut ends).await?;
    println!(
        "phase 2: sent {} records; a new consumer resumes from the stored offsets...",
        phase2.len()
    );
    let second = consume_until(&config, &ends).await?;
    println!(
        "phase 2: applied {}, skipped {} duplicates; consumer stopped",
        second.applied, second.duplicates
    );

    let db = Database::connect(&config.database.url, 1).await.map_err(failed)?;
    let table = db.handler_table(&config.handlers[0].name, &table);
    let effects = db
        .query_i64(&format!("SELECT COUNT(*) FROM {table}"), &[])
        .await
        .map_err(|e| failed(format!("cannot count the rows of {table}: {e}")))?;
    let handler = &config.handlers[0].name;
    let dead = dead_letters::parked_counts(&db)
        .await
        .map_err(failed)?
        .get(handler.as_str())
        .copied()
        .unwrap_or(0);
    let emails = match config.handlers.get(1) {
        Some(notifier) => {
            let emails = db.handler_table(&notifier.name, "emails");
            Some(
                db.query_i64(&format!("SELECT COUNT(*) FROM {emails}"), &[])
                    .await
                    .map_err(failed)?,
            )
        }
        None => None,
    };
    db.close().await;

    let sent = phase1.len() + phase2.len();
    let skipped = first.duplicates + second.duplicates;
    let ok = effects == args.events as i64 && emails.is_none_or(|e| e == args.events as i64);
    if let Some(emails) = emails {
        println!(
            "chain: billing's outbox relayed invoices.created; notifier sent {emails} emails (one per invoice)"
        );
    }
    println!(
        "done in {:.1} s: {sent} records sent, {} unique events, {skipped} duplicates skipped, \
         {effects} rows in {table}, {dead} dead letters -> {}",
        started.elapsed().as_secs_f64(),
        args.events,
        if ok { "effectively once" } else { "MISMATCH" }
    );
    let mut summary = serde_json::json!({
        "events_sent": sent,
        "unique_events": args.events,
        "duplicates_skipped": skipped,
        "effects_applied": effects,
        "dead_letters": dead,
    });
    if let Some(emails) = emails {
        summary["emails_sent"] = emails.into();
    }
    println!("{summary}");
    if ok {
        Ok(())
    } else {
        Err(failed(format!(
            "effects_applied ({effects}) or emails_sent ({emails:?}) != unique_events ({})",
            args.events
        )))
    }
}
