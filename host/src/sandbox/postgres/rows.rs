//! Row constructors, which PostgreSQL may turn into a record type of its own.
//!
//! Regression (the forty-second adversarial read, issue 23): every row that
//! PostgreSQL evaluates as a value of type `record` (a row constructor in a
//! SELECT list, in a cast, as a call's argument) registers its shape, the
//! types of its columns, in a cache of the backend's that nothing empties
//! before the connection closes, `DISCARD ALL` included: 50 statements of
//! 441 casts of differently typed 60-column rows left 208 MB in a handler's
//! session. Where PostgreSQL takes a row apart instead (two rows compared,
//! a row against a subquery's columns, `SET (a, b) = ...`), it makes no
//! type. (`IN` over rows is refused for what it copies: see `operators`.) So a row constructor stands only there, at the top of
//! its side (a row inside a row is a value again).

use super::forbidden;
use crate::sandbox::guard::Refusal;
use serde_json::Value;
use std::collections::HashSet;

/// Refuses a row constructor anywhere PostgreSQL would make it a record.
pub(super) fn check(tree: &Value) -> Result<(), Refusal> {
    let mut taken_apart: HashSet<*const Value> = HashSet::new();
    let mut rows: Vec<*const Value> = Vec::new();
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let (1, Some(Value::Object(kind))) = (fields.len(), fields.get("node"))
                    && let Some((name, inner)) = kind.iter().next()
                {
                    match name.as_str() {
                        "RowExpr" => rows.push(inner),
                        "AExpr" => compared(inner, &mut taken_apart),
                        "SubLink" => taken_apart.extend(row(inner.get("testexpr"))),
                        "MultiAssignRef" => taken_apart.extend(row(inner.get("source"))),
                        _ => {}
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    if rows.iter().all(|r| taken_apart.contains(r)) {
        return Ok(());
    }
    Err(forbidden(
        "a row constructor (`(a, b)`, `ROW(a, b)`) is allowed only where PostgreSQL compares it column by \
         column: `(a, b) = (c, d)` (or <>, <, <=, >, >=, IS [NOT] DISTINCT FROM) and `SET (a, b) = (...)`; \
         anywhere else it is a value of its own record type, \
         which the database session keeps until it closes: name the columns instead",
    ))
}

/// The row constructor `node` is, if it is one.
fn row(node: Option<&Value>) -> Option<*const Value> {
    node?.get("node")?.get("RowExpr").map(|r| r as *const Value)
}

/// The rows an operator expression compares column by column.
fn compared(expr: &Value, taken_apart: &mut HashSet<*const Value>) {
    use pg_query::protobuf::AExprKind as K;
    let kind = expr
        .get("kind")
        .and_then(Value::as_i64)
        .and_then(|k| i32::try_from(k).ok())
        .and_then(|k| K::try_from(k).ok());
    if let (Some(K::AexprOp | K::AexprDistinct | K::AexprNotDistinct), Some(left), Some(right)) =
        (kind, row(expr.get("lexpr")), row(expr.get("rexpr")))
    {
        taken_apart.extend([left, right]);
    }
}
