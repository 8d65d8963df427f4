//! PostgreSQL: the names of the functions it could call on a whole row, read
//! from its own catalog for the statement guard (`sandbox::postgres`).
//!
//! PostgreSQL reads `q.name` as the call `name(q)` when `q` has no column
//! `name`: any function of that name that takes one argument a row can be
//! passed to. Which ones exist is the database's knowledge, not the host's
//! (extensions add more), so the list is read, with a test wide on purpose:
//! every function, aggregate or window function callable with one argument
//! whose type is a row type or a pseudo-type, except the pseudo-types that
//! only an array, range, multirange or enum fits.

use super::{Backend, Database, DbError, SqlValue, Tx};
use std::collections::BTreeSet;

const QUERY: &str = "
SELECT DISTINCT p.proname::pg_catalog.text
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_type t ON t.oid = p.proargtypes[0] OR t.oid = p.provariadic
 WHERE p.prokind <> 'p'
   AND p.pronargs >= 1
   AND p.pronargs - p.pronargdefaults <= 1
   AND (t.typtype = 'c'
        OR t.typtype = 'p' AND t.typname::pg_catalog.text NOT IN (
            'anyarray', 'anycompatiblearray', 'anyenum', 'anyrange', 'anycompatiblerange',
            'anymultirange', 'anycompatiblemultirange'))";

/// [`row_functions_in`] in a transaction of its own; empty on SQLite, which
/// has no such notation.
pub async fn row_functions(db: &Database) -> Result<BTreeSet<String>, DbError> {
    if db.backend() != Backend::Postgres {
        return Ok(BTreeSet::new());
    }
    let mut tx = db.begin().await?;
    let names = row_functions_in(&mut tx).await?;
    tx.commit().await?;
    Ok(names)
}

/// The names of the functions PostgreSQL could call on a whole row.
pub async fn row_functions_in(tx: &mut Tx) -> Result<BTreeSet<String>, DbError> {
    let rows = tx.query(QUERY, &[]).await?;
    let mut names = BTreeSet::new();
    for row in rows {
        match row.first() {
            Some(SqlValue::Text(name)) => {
                names.insert(name.clone());
            }
            other => {
                return Err(DbError::Sqlx(sqlx::Error::Decode(
                    format!(
                        "reading the functions PostgreSQL could call on a row: a name came back as {other:?}"
                    )
                    .into(),
                )));
            }
        }
    }
    Ok(names)
}
