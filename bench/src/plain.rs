//! Mode `plain`: the consumer an engineer writes in an afternoon without
//! Inboxd, on the same client libraries, broker, database and input. It is
//! the in-run ceiling of "what a user gets without Inboxd" (issue 24).
//!
//! Per poll of up to [`POLL_MAX`] records, in one transaction: one multi-row
//! claim of the event ids (`ON CONFLICT DO NOTHING RETURNING`), one multi-row
//! insert of the invoices for the claimed ids, one upsert of each partition's
//! next offset; commit, then commit the offsets to the broker. No sandbox, no
//! Wasm, no outbox, one connection, one process.
//!
//! The next offsets it keeps in `plain_offsets` are what the driver reads for
//! progress, as it reads `offsets` for a host.
//!
//! Mode `po` is the same consumer with the outbox the billing handler
//! writes: one message per applied event into `plain_outbox`, in the poll's
//! transaction, and a relay on a second connection that sends what the
//! consumer committed to Kafka and then deletes it (`relay`). No sandbox,
//! no Wasm: the floor of what an inbox with an outbox costs on this
//! machine, which Inboxd's modes can be read against.

use crate::serve::{ServeReport, peak_rss_kib};
use anyhow::Context;
use futures_util::FutureExt;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::Deserialize;
use sqlx::{Executor, PgConnection, SqliteConnection};
use std::collections::{BTreeMap, HashMap};
use tokio::signal::unix::{SignalKind, signal};

/// Records per transaction at most: what a `max.poll.records` of 500 gives.
const POLL_MAX: usize = 500;

/// The driver's progress query for a plain consumer; `{schema}` is `public.`
/// on PostgreSQL (the driver's search path is the host's) and empty on SQLite.
pub fn progress_sql(schema: &str) -> String {
    format!("SELECT CAST(COALESCE(SUM(next_offset), 0) AS BIGINT) FROM {schema}plain_offsets")
}

const SCHEMA: [&str; 4] = [
    "CREATE TABLE IF NOT EXISTS plain_inbox (event_id TEXT PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS invoices (order_id TEXT NOT NULL, customer_email TEXT NOT NULL, \
     amount_cents BIGINT NOT NULL, event_id TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS plain_offsets (topic TEXT NOT NULL, part INTEGER NOT NULL, \
     next_offset BIGINT NOT NULL, PRIMARY KEY (topic, part))",
    // `{id}` is the backend's own key that grows with each insert.
    "CREATE TABLE IF NOT EXISTS plain_outbox (id {id}, key TEXT NOT NULL, payload TEXT NOT NULL)",
];

/// The driver's count of outbox messages not yet sent (mode `po`).
pub fn unsent_sql(schema: &str) -> String {
    format!("SELECT COUNT(*) FROM {schema}plain_outbox")
}

#[derive(Deserialize)]
struct Order {
    order_id: String,
    customer_email: String,
    amount_cents: i64,
}

/// One record's part in a poll.
struct Row {
    event_id: String,
    order: Order,
}

pub(crate) struct Db {
    pub(crate) conn: Conn,
    /// Mode `po`: each applied event writes an outbox message.
    outbox: bool,
}

pub(crate) enum Conn {
    Postgres(PgConnection),
    Sqlite(SqliteConnection),
}

pub struct Options<'a> {
    pub database: &'a str,
    pub brokers: &'a str,
    pub topics: &'a [String],
    pub group: &'a str,
    pub fetch_wait_ms: u32,
    /// Mode `po`: the topic its outbox's messages go to.
    pub outbox_topic: Option<&'a str>,
}

pub async fn serve(opts: Options<'_>) -> anyhow::Result<()> {
    let mut db = connect(opts.database).await?;
    db.outbox = opts.outbox_topic.is_some();
    let committed = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut relay = match opts.outbox_topic {
        Some(topic) => Some(tokio::spawn(crate::plain_relay::run(
            connect(opts.database).await?,
            opts.brokers.to_owned(),
            topic.to_owned(),
            committed.clone(),
        ))),
        None => None,
    };
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", opts.brokers)
        .set("group.id", opts.group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .set("fetch.wait.max.ms", opts.fetch_wait_ms.to_string())
        .create()
        .context("creating the plain consumer")?;
    let topics: Vec<&str> = opts.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    let mut window = Latency::default();
    let mut report = ServeReport::default();
    let mut reset = signal(SignalKind::user_defined1())?;
    let mut term = signal(SignalKind::terminate())?;
    loop {
        let first = tokio::select! {
            _ = reset.recv() => { window.print_and_reset(); continue }
            _ = term.recv() => break,
            first = consumer.recv() => first?,
        };
        // The rest of the poll: whatever librdkafka already holds.
        let mut poll = vec![first];
        while poll.len() < POLL_MAX {
            match consumer.recv().now_or_never() {
                Some(message) => poll.push(message?),
                None => break,
            }
        }
        let next = next_offsets(&poll);
        let applied = db.apply(&poll, &next).await?;
        committed.notify_one();
        if let Some(ended) = relay.take_if(|r| r.is_finished()) {
            ended.await.context("the relay panicked")??;
            anyhow::bail!("the relay stopped");
        }
        let committed_ms = now_ms();
        report.applied += applied;
        report.duplicates += poll.len() as u64 - applied;
        for m in &poll {
            if let Some(produced) = m.timestamp().to_millis() {
                window.record((committed_ms - produced).max(0) as u64);
            }
        }
        consumer.commit(&offset_list(&next)?, CommitMode::Async)?;
    }
    (
        report.latency_p50_ms,
        report.latency_p99_ms,
        report.latency_max_ms,
    ) = window.percentiles();
    report.peak_rss_kib = peak_rss_kib();
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn connect(url: &str) -> anyhow::Result<Db> {
    use sqlx::Connection;
    let mut conn = if url.starts_with("postgres") {
        Conn::Postgres(PgConnection::connect(url).await?)
    } else {
        let options: sqlx::sqlite::SqliteConnectOptions = url.parse()?;
        // The same durability the host uses: WAL, a full sync per commit.
        let options = options
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Full);
        Conn::Sqlite(SqliteConnection::connect_with(&options).await?)
    };
    for statement in SCHEMA {
        match &mut conn {
            Conn::Postgres(c) => {
                c.execute(statement.replace("{id}", "BIGSERIAL PRIMARY KEY").as_str())
                    .await?;
            }
            Conn::Sqlite(c) => {
                c.execute(statement.replace("{id}", "INTEGER PRIMARY KEY").as_str())
                    .await?;
            }
        }
    }
    Ok(Db { conn, outbox: false })
}

impl Db {
    /// Applies one poll in one transaction; returns the events it applied.
    async fn apply(&mut self, poll: &[BorrowedMessage<'_>], next: &Next<'_>) -> anyhow::Result<u64> {
        let rows = poll.iter().map(row).collect::<anyhow::Result<Vec<_>>>()?;
        match &mut self.conn {
            Conn::Postgres(c) => apply_postgres(c, &rows, next, self.outbox).await,
            Conn::Sqlite(c) => apply_sqlite(c, &rows, next, self.outbox).await,
        }
    }
}

fn row(m: &BorrowedMessage<'_>) -> anyhow::Result<Row> {
    let headers = m.headers().context("a record without headers")?;
    let event_id = headers
        .iter()
        .find(|h| h.key == "event_id")
        .and_then(|h| h.value)
        .context("a record without an event_id header")?;
    Ok(Row {
        event_id: String::from_utf8(event_id.to_vec())?,
        order: serde_json::from_slice(m.payload().unwrap_or_default())?,
    })
}

/// The first row of each claimed id (a poll may hold a re-send of its own).
fn claimed_rows<'r>(rows: &'r [Row], claimed: &[String]) -> Vec<&'r Row> {
    let mut by_id: HashMap<&str, &Row> = HashMap::with_capacity(rows.len());
    for r in rows.iter().rev() {
        by_id.insert(&r.event_id, r);
    }
    claimed
        .iter()
        .filter_map(|id| by_id.get(id.as_str()).copied())
        .collect()
}

async fn apply_postgres(
    c: &mut PgConnection,
    rows: &[Row],
    next: &Next<'_>,
    outbox: bool,
) -> anyhow::Result<u64> {
    use sqlx::Connection;
    let mut tx = c.begin().await?;
    let ids: Vec<&str> = rows.iter().map(|r| r.event_id.as_str()).collect();
    let claimed: Vec<String> = sqlx::query_scalar(
        "INSERT INTO plain_inbox (event_id) SELECT unnest($1::text[]) \
         ON CONFLICT DO NOTHING RETURNING event_id",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    let fresh = claimed_rows(rows, &claimed);
    if !fresh.is_empty() {
        sqlx::query(
            "INSERT INTO invoices (order_id, customer_email, amount_cents, event_id) \
             SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[])",
        )
        .bind(
            fresh
                .iter()
                .map(|r| r.order.order_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            fresh
                .iter()
                .map(|r| r.order.customer_email.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(fresh.iter().map(|r| r.order.amount_cents).collect::<Vec<_>>())
        .bind(fresh.iter().map(|r| r.event_id.as_str()).collect::<Vec<_>>())
        .execute(&mut *tx)
        .await?;
        if outbox {
            sqlx::query(
                "INSERT INTO plain_outbox (key, payload) SELECT * FROM unnest($1::text[], $2::text[])",
            )
            .bind(
                fresh
                    .iter()
                    .map(|r| r.order.order_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(fresh.iter().map(|r| invoice_message(r)).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?;
        }
    }
    sqlx::query(
        "INSERT INTO plain_offsets (topic, part, next_offset) \
         SELECT * FROM unnest($1::text[], $2::int4[], $3::int8[]) \
         ON CONFLICT (topic, part) DO UPDATE SET next_offset = excluded.next_offset",
    )
    .bind(next.keys().map(|(t, _)| *t).collect::<Vec<_>>())
    .bind(next.keys().map(|(_, p)| *p).collect::<Vec<_>>())
    .bind(next.values().copied().collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(fresh.len() as u64)
}

async fn apply_sqlite(
    c: &mut SqliteConnection,
    rows: &[Row],
    next: &Next<'_>,
    outbox: bool,
) -> anyhow::Result<u64> {
    use sqlx::Connection;
    let mut tx = c.begin().await?;
    let claim = format!(
        "INSERT INTO plain_inbox (event_id) VALUES {} ON CONFLICT DO NOTHING RETURNING event_id",
        vec!["(?)"; rows.len()].join(",")
    );
    let mut query = sqlx::query_scalar(&claim);
    for r in rows {
        query = query.bind(r.event_id.as_str());
    }
    let claimed: Vec<String> = query.fetch_all(&mut *tx).await?;
    let fresh = claimed_rows(rows, &claimed);
    if !fresh.is_empty() {
        let insert = format!(
            "INSERT INTO invoices (order_id, customer_email, amount_cents, event_id) VALUES {}",
            vec!["(?,?,?,?)"; fresh.len()].join(",")
        );
        let mut query = sqlx::query(&insert);
        for r in &fresh {
            query = query
                .bind(r.order.order_id.as_str())
                .bind(r.order.customer_email.as_str())
                .bind(r.order.amount_cents)
                .bind(r.event_id.as_str());
        }
        query.execute(&mut *tx).await?;
        if outbox {
            let insert = format!(
                "INSERT INTO plain_outbox (key, payload) VALUES {}",
                vec!["(?,?)"; fresh.len()].join(",")
            );
            let mut query = sqlx::query(&insert);
            for r in &fresh {
                query = query.bind(r.order.order_id.as_str()).bind(invoice_message(r));
            }
            query.execute(&mut *tx).await?;
        }
    }
    for ((topic, part), offset) in next {
        sqlx::query(
            "INSERT INTO plain_offsets (topic, part, next_offset) VALUES (?, ?, ?) \
             ON CONFLICT (topic, part) DO UPDATE SET next_offset = excluded.next_offset",
        )
        .bind(*topic)
        .bind(*part)
        .bind(*offset)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(fresh.len() as u64)
}

/// The message the billing handler publishes for an order, with an id of
/// its own as the host stamps one.
fn invoice_message(r: &Row) -> String {
    serde_json::json!({
        "order_id": r.order.order_id,
        "customer_email": r.order.customer_email,
        "amount_cents": r.order.amount_cents,
        "order_event_id": r.event_id,
        "event_id": uuid::Uuid::now_v7().to_string(),
    })
    .to_string()
}

/// Each partition's next offset after a poll.
type Next<'m> = BTreeMap<(&'m str, i32), i64>;

fn next_offsets<'m>(poll: &'m [BorrowedMessage<'_>]) -> Next<'m> {
    poll.iter()
        .map(|m| ((m.topic(), m.partition()), m.offset() + 1))
        .collect()
}

fn offset_list(next: &Next<'_>) -> anyhow::Result<TopicPartitionList> {
    let mut list = TopicPartitionList::new();
    for ((topic, part), offset) in next {
        list.add_partition_offset(topic, *part, Offset::Offset(*offset))?;
    }
    Ok(list)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Produce-to-commit times of one window (a phase of the run).
#[derive(Default)]
struct Latency {
    ms: Vec<u64>,
}

impl Latency {
    fn record(&mut self, ms: u64) {
        self.ms.push(ms);
    }

    /// (p50, p99, max) in ms.
    fn percentiles(&mut self) -> (u64, u64, u64) {
        self.ms.sort_unstable();
        let at = |q: f64| match self.ms.len() {
            0 => 0,
            n => self.ms[((n as f64 * q).ceil() as usize).clamp(1, n) - 1],
        };
        (at(0.5), at(0.99), self.ms.last().copied().unwrap_or(0))
    }

    /// What a host prints on SIGUSR1: the window's latency, then a new window.
    fn print_and_reset(&mut self) {
        let (p50, p99, max) = self.percentiles();
        println!(
            "{}",
            serde_json::json!({"latency_p50_ms": p50, "latency_p99_ms": p99, "latency_max_ms": max})
        );
        self.ms.clear();
    }
}
