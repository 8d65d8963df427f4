//! Mode `po`'s relay: what a team writes beside the plain consumer to send
//! its outbox. On a connection of its own it reads the oldest committed
//! messages (up to [`READ_MAX`]), sends them to Kafka, waits for the
//! broker's acknowledgements, then deletes them in one statement. It wakes
//! when the consumer commits, or every [`IDLE`] otherwise.

use crate::plain::{Conn, Db};
use anyhow::Context;
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Messages read, sent and deleted at a time.
const READ_MAX: i64 = 1_000;

/// How long an idle relay sleeps when no commit wakes it.
const IDLE: Duration = Duration::from_millis(50);

pub(crate) async fn run(
    mut db: Db,
    brokers: String,
    topic: String,
    committed: Arc<Notify>,
) -> anyhow::Result<()> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "true")
        .create()
        .context("creating the relay's producer")?;
    loop {
        let messages = oldest(&mut db.conn).await?;
        let Some(&(last, _, _)) = messages.last() else {
            tokio::select! {
                _ = committed.notified() => {}
                _ = tokio::time::sleep(IDLE) => {}
            }
            continue;
        };
        let sends: Vec<_> = messages
            .iter()
            .map(|(_, key, payload)| {
                producer.send(
                    FutureRecord::to(&topic).key(key).payload(payload),
                    Timeout::After(Duration::from_secs(30)),
                )
            })
            .collect();
        for sent in futures_util::future::join_all(sends).await {
            sent.map_err(|(e, _)| e).context("sending an outbox message")?;
        }
        // Ids grow with each insert and one connection commits them in
        // order, so every message up to `last` was among those read.
        match &mut db.conn {
            Conn::Postgres(c) => {
                sqlx::query("DELETE FROM plain_outbox WHERE id <= $1")
                    .bind(last)
                    .execute(&mut *c)
                    .await?;
            }
            Conn::Sqlite(c) => {
                sqlx::query("DELETE FROM plain_outbox WHERE id <= ?")
                    .bind(last)
                    .execute(&mut *c)
                    .await?;
            }
        }
    }
}

/// The oldest messages not yet sent: (id, key, payload).
async fn oldest(conn: &mut Conn) -> anyhow::Result<Vec<(i64, String, String)>> {
    const READ: &str = "SELECT id, key, payload FROM plain_outbox ORDER BY id LIMIT ";
    Ok(match conn {
        Conn::Postgres(c) => {
            sqlx::query_as(&format!("{READ}{READ_MAX}"))
                .fetch_all(&mut *c)
                .await?
        }
        Conn::Sqlite(c) => {
            sqlx::query_as(&format!("{READ}{READ_MAX}"))
                .fetch_all(&mut *c)
                .await?
        }
    })
}
