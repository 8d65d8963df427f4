//! What a handler's events left in the database, read back whole: the rows of
//! its own tables, its outbox messages and its inbox rows.
//!
//! `inboxd test` prints these and compares them with what a team expects. It
//! runs on a throwaway database of a team's own sample events, so nothing here
//! is paged; on a production database use `inboxd status` and the dead-letter
//! commands instead.

use super::columns::Columns;
use super::headers::headers_column;
use super::migrate::own_tables;
use super::{Backend, Database, DbError, DecodeError, SqlValue, handler_schema, quote_ident};
use serde_json::{Map, Value};

/// One outbox message, published or not.
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Where an event id was claimed, and how it ended.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub event_id: String,
    /// `done` (applied) or `dead` (parked).
    pub status: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// A table of the handler's, with its rows as JSON objects (column name to
/// value; a BLOB is `{"base64": "..."}`).
#[derive(Debug, Clone)]
pub struct TableRows {
    pub table: String,
    pub rows: Vec<Map<String, Value>>,
}

/// Every table and view the handler's migrations made, with all their rows,
/// tables in name order.
pub async fn tables(db: &Database, handler: &str) -> Result<Vec<TableRows>, DbError> {
    let mut names = own_tables(db, handler).await?;
    names.sort();
    let mut tables = Vec::with_capacity(names.len());
    for table in names {
        let rows = match db.backend() {
            Backend::Postgres => postgres_rows(db, handler, &table).await?,
            Backend::Sqlite => sqlite_rows(db, &table).await?,
        };
        tables.push(TableRows { table, rows });
    }
    Ok(tables)
}

/// PostgreSQL writes the JSON itself, so every column type (numeric,
/// timestamptz, arrays, ...) comes out as PostgreSQL shows it.
async fn postgres_rows(
    db: &Database,
    handler: &str,
    table: &str,
) -> Result<Vec<Map<String, Value>>, DbError> {
    let sql = format!(
        "SELECT pg_catalog.row_to_json(t)::pg_catalog.text FROM {}.{} AS t",
        quote_ident(&handler_schema(handler)),
        quote_ident(table)
    );
    db.query(&sql, &[])
        .await?
        .into_iter()
        .map(|row| {
            let mut c = Columns::new("table row", row);
            let json = c.text("row_to_json")?;
            match serde_json::from_str(&json) {
                Ok(Value::Object(object)) => Ok(object),
                _ => Err(c.wrong("row_to_json", "a JSON object", "other text").into()),
            }
        })
        .collect()
}

/// SQLite's columns by name from its catalog, values by their own type.
async fn sqlite_rows(db: &Database, table: &str) -> Result<Vec<Map<String, Value>>, DbError> {
    let columns: Vec<String> = db
        .query(
            "SELECT name FROM pragma_table_info($1) ORDER BY cid",
            &[table.into()],
        )
        .await?
        .into_iter()
        .map(|row| Columns::new("table column", row).text("name"))
        .collect::<Result<_, _>>()?;
    if columns.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
    let sql = format!("SELECT {} FROM {}", list.join(", "), quote_ident(table));
    let rows = db.query(&sql, &[]).await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            columns
                .iter()
                .cloned()
                .zip(row.into_iter().map(json_value))
                .collect()
        })
        .collect())
}

fn json_value(value: SqlValue) -> Value {
    use base64::Engine;
    match value {
        SqlValue::Null => Value::Null,
        SqlValue::Int64(v) => v.into(),
        SqlValue::Float64(v) => v.into(),
        SqlValue::Text(v) => v.into(),
        SqlValue::Boolean(v) => v.into(),
        SqlValue::Blob(v) => {
            serde_json::json!({ "base64": base64::engine::general_purpose::STANDARD.encode(v) })
        }
    }
}

/// The handler's outbox messages in insert order.
pub async fn outbox(db: &Database, handler: &str) -> Result<Vec<Message>, DbError> {
    db.query(
        "SELECT topic, key, payload, headers FROM outbox WHERE handler = $1 ORDER BY seq",
        &[handler.into()],
    )
    .await?
    .into_iter()
    .map(|row| {
        let mut c = Columns::new("outbox row", row);
        Ok(Message {
            topic: c.text("topic")?,
            key: c.opt_blob("key")?,
            payload: c.opt_blob("payload")?.unwrap_or_default(),
            headers: headers_column(&mut c, "headers")?,
        })
    })
    .collect::<Result<_, DecodeError>>()
    .map_err(DbError::from)
}

/// The handler's inbox rows.
pub async fn inbox(db: &Database, handler: &str) -> Result<Vec<Claimed>, DbError> {
    db.query(
        r#"SELECT event_id, status, topic, partition, "offset" FROM inbox WHERE handler = $1"#,
        &[handler.into()],
    )
    .await?
    .into_iter()
    .map(|row| {
        let mut c = Columns::new("inbox row", row);
        let (event_id, status, topic) = (c.text("event_id")?, c.text("status")?, c.text("topic")?);
        let (partition, offset) = (c.int("partition")?, c.int("offset")?);
        let partition = i32::try_from(partition)
            .map_err(|_| c.wrong("partition", "a partition number", "a larger integer"))?;
        Ok(Claimed {
            event_id,
            status,
            topic,
            partition,
            offset,
        })
    })
    .collect::<Result<_, DecodeError>>()
    .map_err(DbError::from)
}
