//! SQL values as they cross between the host, the database and guests.
//!
//! One enum for parameters and returned columns on both backends, so the host's
//! own queries and a guest's statements go through the same binding code. Rows
//! are decoded by the value's runtime type; a column type the sql interface
//! cannot represent is an error that tells the author how to cast it.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgArgumentBuffer, PgArguments, PgRow, PgTypeInfo};
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Postgres, Row, Sqlite, TypeInfo, ValueRef};

#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    Null,
    Int64(i64),
    Float64(f64),
    Text(String),
    Blob(Vec<u8>),
    Boolean(bool),
}

impl SqlValue {
    /// One letter per kind, for the parameter kinds in a cached statement's
    /// text (see `Tx::guest_text`).
    pub fn kind_letter(&self) -> char {
        match self {
            SqlValue::Null => 'n',
            SqlValue::Int64(_) => 'i',
            SqlValue::Float64(_) => 'f',
            SqlValue::Text(_) => 't',
            SqlValue::Blob(_) => 'b',
            SqlValue::Boolean(_) => 'o',
        }
    }

    /// Bytes the value takes in a result: its text or blob, 8 for numbers.
    pub fn size(&self) -> usize {
        match self {
            SqlValue::Null | SqlValue::Boolean(_) => 1,
            SqlValue::Int64(_) | SqlValue::Float64(_) => 8,
            SqlValue::Text(v) => v.len(),
            SqlValue::Blob(v) => v.len(),
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            SqlValue::Int64(v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            SqlValue::Text(v) => Some(v),
            _ => None,
        }
    }
}

impl From<&str> for SqlValue {
    fn from(v: &str) -> Self {
        SqlValue::Text(v.to_owned())
    }
}
impl From<String> for SqlValue {
    fn from(v: String) -> Self {
        SqlValue::Text(v)
    }
}
impl From<i64> for SqlValue {
    fn from(v: i64) -> Self {
        SqlValue::Int64(v)
    }
}
impl From<i32> for SqlValue {
    fn from(v: i32) -> Self {
        SqlValue::Int64(v.into())
    }
}
impl From<u32> for SqlValue {
    fn from(v: u32) -> Self {
        SqlValue::Int64(v.into())
    }
}
impl<T: Into<SqlValue>> From<Option<T>> for SqlValue {
    fn from(v: Option<T>) -> Self {
        v.map_or(SqlValue::Null, Into::into)
    }
}
impl From<&[u8]> for SqlValue {
    fn from(v: &[u8]) -> Self {
        SqlValue::Blob(v.to_vec())
    }
}

/// A column whose type the sql interface has no value for.
#[derive(Debug, thiserror::Error)]
#[error(
    "column {index} ({name:?}) has type {type_name}, which the sql interface cannot return; \
     cast it in the query, e.g. CAST({name} AS TEXT)"
)]
pub struct UnsupportedColumn {
    pub index: usize,
    pub name: String,
    pub type_name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Unsupported(#[from] UnsupportedColumn),
    #[error(transparent)]
    Sqlx(#[from] sqlx::Error),
    /// One of the host's own rows does not hold what its query selected
    /// (see [`super::columns::Columns`]).
    #[error("reading a {what}: column {column} holds {found} where {expected} was expected")]
    Column {
        what: &'static str,
        column: &'static str,
        expected: &'static str,
        found: String,
    },
}

pub(crate) fn bind_sqlite<'q>(
    mut query: Query<'q, Sqlite, SqliteArguments<'q>>,
    params: &'q [SqlValue],
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    for param in params {
        query = match param {
            SqlValue::Null => query.bind(None::<i64>),
            SqlValue::Int64(v) => query.bind(*v),
            SqlValue::Float64(v) => query.bind(*v),
            SqlValue::Text(v) => query.bind(v.as_str()),
            SqlValue::Blob(v) => query.bind(v.as_slice()),
            SqlValue::Boolean(v) => query.bind(*v),
        };
    }
    query
}

/// A NULL parameter whose type PostgreSQL infers from where it is used. A
/// typed NULL (say TEXT) would be refused by a BIGINT or BYTEA column.
struct UntypedNull;

impl sqlx::Type<Postgres> for UntypedNull {
    fn type_info() -> PgTypeInfo {
        // OID 0: "unspecified" in the extended query protocol.
        PgTypeInfo::with_oid(Oid(0))
    }
}

impl sqlx::Encode<'_, Postgres> for UntypedNull {
    fn encode_by_ref(&self, _buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        Ok(IsNull::Yes)
    }
}

pub(crate) fn bind_postgres<'q>(
    mut query: Query<'q, Postgres, PgArguments>,
    params: &'q [SqlValue],
    arrays: &'q [PgArray<'q>],
) -> Query<'q, Postgres, PgArguments> {
    for param in params {
        query = match param {
            SqlValue::Null => query.bind(UntypedNull),
            SqlValue::Int64(v) => query.bind(*v),
            SqlValue::Float64(v) => query.bind(*v),
            SqlValue::Text(v) => query.bind(v.as_str()),
            SqlValue::Blob(v) => query.bind(v.as_slice()),
            SqlValue::Boolean(v) => query.bind(*v),
        };
    }
    for array in arrays {
        query = match array {
            PgArray::Texts(v) => query.bind(v.as_slice()),
            PgArray::Ints(v) => query.bind(v.as_slice()),
            PgArray::Blobs(v) => query.bind(v.as_slice()),
        };
    }
    query
}

/// A column of rows, sent as one PostgreSQL array in binary (`text[]`,
/// `int8[]`, `bytea[]`): how the host hands a batch's claims and outbox
/// messages to its gates, which read them with `unnest`. Parsing the same
/// rows from JSON, with bytes in hex, cost PostgreSQL about a third of the
/// outbox insert (issue 24). The host's own statements only: a guest's
/// parameters are [`SqlValue`]s.
#[derive(Debug, Clone, PartialEq)]
pub enum PgArray<'a> {
    Texts(Vec<&'a str>),
    Ints(Vec<i64>),
    /// NULL where a row has no value (a message without a key).
    Blobs(Vec<Option<&'a [u8]>>),
}

fn unsupported(row: &impl Row, index: usize, type_name: &str) -> UnsupportedColumn {
    use sqlx::Column;
    UnsupportedColumn {
        index,
        name: row.columns()[index].name().to_owned(),
        type_name: type_name.to_owned(),
    }
}

pub(crate) fn decode_sqlite(row: &SqliteRow) -> Result<Vec<SqlValue>, DecodeError> {
    (0..row.len())
        .map(|i| {
            let raw = row.try_get_raw(i)?;
            if raw.is_null() {
                return Ok(SqlValue::Null);
            }
            // SQLite reports the value's storage class here, not the declared type.
            let type_info = raw.type_info();
            Ok(match type_info.name() {
                "INTEGER" => SqlValue::Int64(row.try_get_unchecked(i)?),
                "REAL" => SqlValue::Float64(row.try_get_unchecked(i)?),
                "TEXT" => SqlValue::Text(row.try_get_unchecked(i)?),
                "BLOB" => SqlValue::Blob(row.try_get_unchecked(i)?),
                "BOOLEAN" => SqlValue::Boolean(row.try_get_unchecked(i)?),
                other => return Err(unsupported(row, i, other).into()),
            })
        })
        .collect()
}

/// What decoding `row` will hold at least: its values' bytes as received,
/// and the host's own per value ([`SqlValue`]). Weighed before the row is
/// decoded, so a row past a result's bound is refused without being copied
/// (a row may be 64 values of `limits.max_row_bytes`: the fifty-second read).
pub(crate) fn postgres_row_bytes(row: &PgRow) -> usize {
    (0..row.len())
        .map(|i| {
            let raw = row.try_get_raw(i).ok();
            let bytes = raw.and_then(|raw| raw.as_bytes().ok()).map_or(0, <[u8]>::len);
            std::mem::size_of::<SqlValue>() + bytes
        })
        .sum()
}

pub(crate) fn decode_postgres(row: &PgRow) -> Result<Vec<SqlValue>, DecodeError> {
    (0..row.len())
        .map(|i| {
            let raw = row.try_get_raw(i)?;
            if raw.is_null() {
                return Ok(SqlValue::Null);
            }
            let type_info = raw.type_info();
            Ok(match type_info.name() {
                "INT2" => SqlValue::Int64(row.try_get::<i16, _>(i)?.into()),
                "INT4" => SqlValue::Int64(row.try_get::<i32, _>(i)?.into()),
                "INT8" => SqlValue::Int64(row.try_get(i)?),
                "FLOAT4" => SqlValue::Float64(row.try_get::<f32, _>(i)?.into()),
                "FLOAT8" => SqlValue::Float64(row.try_get(i)?),
                "BOOL" => SqlValue::Boolean(row.try_get(i)?),
                "TEXT" | "VARCHAR" | "BPCHAR" | "NAME" => SqlValue::Text(row.try_get(i)?),
                "UUID" => SqlValue::Text(row.try_get::<uuid::Uuid, _>(i)?.to_string()),
                "BYTEA" => SqlValue::Blob(row.try_get(i)?),
                other => return Err(unsupported(row, i, other).into()),
            })
        })
        .collect()
}
