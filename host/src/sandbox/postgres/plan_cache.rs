//! Which of a handler's statements its PostgreSQL session may keep
//! prepared (the twenty-second adversarial read, issue 23).
//!
//! The host prepares a guest's statement once per session and keeps it, so
//! the events that send it again skip the parse and the planning. A kept
//! statement keeps its plan, and a plan's size grows with the columns of
//! every relation it joins times the number of joins: each join of the
//! query tree lists every column of both its sides. A 20-way self-join of a
//! 1,600-column table with 63-byte column names held 134 MB in one plan, and
//! a distinct literal per event made a new one each time: twelve held
//! 1.5 GB, and a session keeps up to 100. So a handler's relations have at
//! most [`MAX_COLUMNS`] columns, dropped ones included (a plan lists those
//! too; `db::migrate::catalog_rules`), a session keeps at most
//! [`KEPT_STATEMENTS`] (`db::logins`), and it keeps only a statement whose
//! rows come from names alone: at most [`MAX_KEPT_RELATIONS`] tables or
//! views, anywhere in it, no CTE, no subquery, VALUES or function in FROM
//! (each may be as wide as PostgreSQL allows, 1,664 columns: the review of
//! the twenty-second read kept 140 MB from 30 joined VALUES lists of 1,000
//! columns, and 9.8 MB from a 1,664-column CTE read four times), in at most
//! [`MAX_KEPT_TEXT_BYTES`]. Anything else runs as PostgreSQL's unnamed
//! statement, freed by the next one. Measured on PostgreSQL 15 with a
//! handler's settings, at 64 columns of 63-byte names: one relation
//! 0.04 MB, four joined 0.4-0.5 MB, four views of four tables each 2.1 MB:
//! at most 256 MB kept per session, one statement's `work_mem` bound
//! (`plan_memory`).

use crate::sandbox::guard::Refusal;
use serde_json::Value;

/// The most columns a handler's table or view may have, on both backends
/// (SQLite's is `SQLITE_LIMIT_COLUMN` inside the walls).
pub const MAX_COLUMNS: u64 = crate::sandbox::work::VALUE_ROWS;

/// A statement naming at most this many relations (tables or views,
/// anywhere in it) may be kept prepared.
pub const MAX_KEPT_RELATIONS: usize = 4;

/// A statement text longer than this is not kept prepared (a plan holds
/// every expression of its text: a 112 KB CASE kept 6.7 MB).
pub const MAX_KEPT_TEXT_BYTES: usize = 16 * 1024;

/// How many statements a handler's session keeps prepared at most (the
/// host's own included; the least recently used is closed first).
pub const KEPT_STATEMENTS: usize = 64;

/// FROM items other than a name, and a CTE: each may be as wide as
/// PostgreSQL allows.
const WIDE_SOURCES: &[&str] = &[
    "RangeSubselect",
    "RangeFunction",
    "RangeTableFunc",
    "RangeTableSample",
    "CommonTableExpr",
];

/// Whether the session may keep the statement of `tree`, written as `sql`,
/// prepared.
pub(super) fn keeps(sql: &str, tree: &Value) -> bool {
    if sql.len() > MAX_KEPT_TEXT_BYTES {
        return false;
    }
    let mut relations = 0usize;
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if WIDE_SOURCES.iter().any(|kind| fields.contains_key(*kind)) {
                    return false;
                }
                // A RangeVar, in FROM or as the target of a write: the only
                // node with a relation's name.
                relations += usize::from(fields.get("relname").is_some_and(Value::is_string));
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    relations <= MAX_KEPT_RELATIONS
}

/// The longest text of a view's definition. PostgreSQL copies a view's whole
/// query, its WHERE and ON included, into every statement that reads it, so
/// a statement of four names can hold four views' texts; the review of the
/// twenty-second read kept 88 MB in one such plan from a 1 MB WHERE (a CASE
/// of 33,000 arms, which costs the work model nothing).
pub const MAX_VIEW_TEXT_BYTES: usize = 8 * 1024;

/// Refuses a view whose definition is longer than [`MAX_VIEW_TEXT_BYTES`].
pub(super) fn check_view_text(sql: &str) -> Result<(), Refusal> {
    if sql.len() > MAX_VIEW_TEXT_BYTES {
        return Err(Refusal::Limit(format!(
            "this view's definition is {} bytes; at most {MAX_VIEW_TEXT_BYTES}: PostgreSQL copies a view's \
             whole query into every statement that reads it, and the handler's session keeps those \
             statements prepared",
            sql.len()
        )));
    }
    Ok(())
}
