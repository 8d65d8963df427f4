//! The relations one migration statement may make or lock at once.
//!
//! The host counts a migration's locks after each statement
//! (`db::migrate::catalog_rules`, at most 1,000), but a statement's own
//! locks are all taken before that count runs: one `CREATE TABLE` with 1,600
//! `UNIQUE` columns makes 1,600 indexes, each a lock in PostgreSQL's shared
//! lock table (about 10,000 entries for the whole server), whose exhaustion
//! fails every session's statements and new connections (the review of the
//! nineteenth adversarial read, issue 23). So a statement may name only a
//! few constraints that make an index or lock another table.

use crate::sandbox::guard::Refusal;
use pg_query::protobuf::ConstrType;
use serde_json::Value;

/// The most indexes (PRIMARY KEY, UNIQUE) and foreign keys one statement
/// may make: with its table, toast table and their indexes, a few dozen
/// locks.
pub(super) const MAX_KEYS_PER_STATEMENT: usize = 32;

/// Counts the keys a migration statement makes.
pub(super) fn check(tree: &Value) -> Result<(), Refusal> {
    let keyed = [
        ConstrType::ConstrPrimary,
        ConstrType::ConstrUnique,
        ConstrType::ConstrForeign,
    ]
    .map(|t| t as i64);
    let mut keys = 0usize;
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(constraint) = fields.get("Constraint") {
                    let kind = constraint.get("contype").and_then(Value::as_i64);
                    keys += usize::from(kind.is_some_and(|k| keyed.contains(&k)));
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    if keys > MAX_KEYS_PER_STATEMENT {
        return Err(Refusal::Limit(format!(
            "this statement makes {keys} primary keys, unique constraints and foreign keys; at most \
             {MAX_KEYS_PER_STATEMENT} in one statement (each is an index or a lock on another table, \
             all taken before the statement ends, and PostgreSQL's lock table is shared by every \
             session): split it into several statements"
        )));
    }
    Ok(())
}
