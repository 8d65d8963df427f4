//! PostgreSQL's daily inbox partitions (`inbox.partitioning = "daily"`).
//!
//! A partition holds the inbox rows whose event id's UUIDv7 timestamp falls on
//! one UTC day (`id_day`). The host creates them a little ahead of time and
//! drops them whole once the whole day is past retention, which costs a
//! catalog change instead of deleting millions of rows. Each DDL statement runs
//! with a short lock timeout, so it waits behind the pipeline's (short)
//! transactions for at most that long and is retried on the next cycle.

use super::columns::texts;
use super::{Backend, Database, DbError, DecodeError, HOST_SCHEMA};

/// DDL gives up rather than queue behind traffic for longer than this.
const DDL_LOCK_TIMEOUT: &str = "2s";

pub fn partition_name(day: i32) -> String {
    format!("inbox_d{day}")
}

/// The daily partitions that exist, with their day, oldest first.
pub async fn list_daily(db: &Database) -> Result<Vec<(String, i32)>, DbError> {
    let rows = db
        .query(
            "SELECT c.relname::text FROM pg_inherits i
             JOIN pg_class c ON c.oid = i.inhrelid
             JOIN pg_class p ON p.oid = i.inhparent
             JOIN pg_namespace n ON n.oid = p.relnamespace
             WHERE n.nspname = $1 AND p.relname = 'inbox' AND c.relname ~ '^inbox_d[0-9]+$'",
            &[HOST_SCHEMA.into()],
        )
        .await?;
    // The pattern leaves out `inbox_default`; every name it matches is a day.
    let names = texts(rows, "inbox partition", "relname")?;
    let mut days = names
        .into_iter()
        .map(|name| match name["inbox_d".len()..].parse() {
            Ok(day) => Ok((name, day)),
            Err(_) => Err(DecodeError::Column {
                what: "inbox partition",
                column: "relname",
                expected: "inbox_d and a day number",
                found: name,
            }),
        })
        .collect::<Result<Vec<(String, i32)>, DecodeError>>()?;
    days.sort_by_key(|(_, day)| *day);
    Ok(days)
}

/// Creates the partitions for `days` that do not exist yet; returns the ones created.
///
/// A day whose rows already sit in the default partition cannot get a
/// partition of its own (PostgreSQL refuses); those rows stay where they are,
/// where row purges reach them, and dedup is unaffected either way.
pub async fn ensure_daily(
    db: &Database,
    days: std::ops::RangeInclusive<i32>,
) -> Result<Vec<String>, DbError> {
    if db.backend() != Backend::Postgres {
        return Ok(Vec::new());
    }
    let existing: Vec<i32> = list_daily(db).await?.into_iter().map(|(_, d)| d).collect();
    let mut created = Vec::new();
    for day in days.filter(|d| !existing.contains(d)) {
        let name = partition_name(day);
        let ddl = format!(
            "CREATE TABLE {name} PARTITION OF inbox FOR VALUES FROM ({day}) TO ({})",
            day + 1
        );
        match run_ddl(db, &ddl).await {
            Ok(()) => created.push(name),
            Err(error) => tracing::warn!("inbox partition {name} not created (retried next cycle): {error}"),
        }
    }
    Ok(created)
}

/// Rows in one partition (progress output and dry runs).
pub async fn row_count(db: &Database, name: &str) -> Result<i64, DbError> {
    db.query_i64(&format!("SELECT COUNT(*) FROM {name}"), &[]).await
}

pub async fn drop_partition(db: &Database, name: &str) -> Result<(), DbError> {
    run_ddl(db, &format!("DROP TABLE {name}")).await
}

async fn run_ddl(db: &Database, ddl: &str) -> Result<(), DbError> {
    let mut tx = db.begin().await?;
    tx.execute(&format!("SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'"), &[])
        .await?;
    tx.execute(ddl, &[]).await?;
    tx.commit().await
}
