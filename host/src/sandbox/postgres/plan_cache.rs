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
//! most [`MAX_COLUMNS`] columns (`db::migrate::catalog_rules`), a statement
//! naming more than [`MAX_KEPT_RELATIONS`] relations runs as PostgreSQL's
//! unnamed statement (freed by the next one), and a session keeps at most
//! [`KEPT_STATEMENTS`] (`db::logins`). Measured on PostgreSQL 15 with a
//! handler's settings, at 64 columns of 63-byte names: one relation 0.04 MB,
//! four joined 0.5 MB, eight 1.5 MB, sixteen (four names of views of four
//! tables each) 4 MB: at most 256 MB kept per session, one statement's
//! `work_mem` bound (`plan_memory`).

use serde_json::Value;

/// The most columns a handler's table or view may have, on both backends
/// (SQLite's is `SQLITE_LIMIT_COLUMN` inside the walls).
pub const MAX_COLUMNS: u64 = crate::sandbox::work::VALUE_ROWS;

/// A statement naming at most this many relations (tables, views, CTEs,
/// anywhere in it) is kept prepared.
pub const MAX_KEPT_RELATIONS: usize = 4;

/// How many statements a handler's session keeps prepared at most (the
/// host's own included; the least recently used is closed first).
pub const KEPT_STATEMENTS: usize = 64;

/// Whether the session may keep the statement of `tree` prepared.
pub(super) fn keeps(tree: &Value) -> bool {
    let mut relations = 0usize;
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
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
