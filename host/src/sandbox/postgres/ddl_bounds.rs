//! What one migration statement may make or set beyond the expression
//! rules: the relations it makes or locks at once, and no planner or storage
//! settings.
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
    // An identity column makes a sequence (the twenty-first read: 1,590 of
    // them in one CREATE TABLE held 4,777 locks).
    let keyed = [
        ConstrType::ConstrPrimary,
        ConstrType::ConstrUnique,
        ConstrType::ConstrForeign,
        ConstrType::ConstrIdentity,
    ]
    .map(|t| t as i64);
    let mut keys = 0usize;
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                check_settings(fields)?;
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
            "this statement makes {keys} primary keys, unique constraints, foreign keys and identity \
             columns; at most \
             {MAX_KEYS_PER_STATEMENT} in one statement (each is an index or a lock on another table, \
             all taken before the statement ends, and PostgreSQL's lock table is shared by every \
             session): split it into several statements"
        )));
    }
    Ok(())
}

/// Regression (the twenty-first adversarial read, issue 23): a column's
/// statistics target of 10,000 made the planner compare two 10,000-entry
/// lists of common values for one join, 3.3 s with no interrupt check, and
/// ANALYZE hold its whole sample (1.2 GB for a 1 GB table); storage
/// parameters can turn autovacuum off. The server's defaults stand.
fn check_settings(fields: &serde_json::Map<String, Value>) -> Result<(), Refusal> {
    use pg_query::protobuf::AlterTableType as A;
    let refused = [
        A::AtSetStatistics,
        A::AtSetOptions,
        A::AtResetOptions,
        A::AtSetRelOptions,
        A::AtResetRelOptions,
        A::AtReplaceRelOptions,
    ]
    .map(|t| t as i64);
    let subtype = fields
        .get("AlterTableCmd")
        .and_then(|c| c.get("subtype"))
        .and_then(Value::as_i64);
    let options = ["CreateStmt", "IndexStmt"].iter().any(|kind| {
        fields
            .get(*kind)
            .and_then(|s| s.get("options"))
            .and_then(Value::as_array)
            .is_some_and(|o| !o.is_empty())
    });
    if subtype.is_some_and(|s| refused.contains(&s)) || options {
        return Err(crate::sandbox::guard::forbidden(
            "statistics targets, column options and storage parameters (SET STATISTICS, SET (...), \
             WITH (...)) are not allowed: they change how much memory and uninterrupted time PostgreSQL \
             spends planning and analyzing the table; the server's defaults apply",
        ));
    }
    Ok(())
}
