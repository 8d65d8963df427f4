//! Row constructors, which PostgreSQL may turn into a record type of its own.
//!
//! Regression (the forty-second adversarial read, issue 23): every row that
//! PostgreSQL evaluates as a value of type `record` (a row constructor in a
//! SELECT list, in a cast, as a call's argument) registers its shape, the
//! types of its columns, in a cache of the backend's that nothing empties
//! before the connection closes, `DISCARD ALL` included: 50 statements of
//! 441 casts of differently typed 60-column rows left 208 MB in a handler's
//! session. Where PostgreSQL takes a row apart instead (two rows compared,
//! a row against a subquery's columns, `SET (a, b) = ...`, `GROUP BY (a,
//! b)`), it makes no type. (`IN` over rows is refused for what it copies: see `operators`.) So a row constructor stands only there, at the top of
//! its side (a row inside a row is a value again).

use super::forbidden;
use super::nodes::nodes;
use crate::sandbox::guard::Refusal;
use serde_json::Value;
use std::collections::HashSet;

/// Refuses a row constructor anywhere PostgreSQL would make it a record.
pub(super) fn check(tree: &Value) -> Result<(), Refusal> {
    let mut taken_apart: HashSet<*const Value> = HashSet::new();
    let mut rows: Vec<*const Value> = Vec::new();
    for (name, inner) in nodes(tree) {
        match name {
            "RowExpr" => rows.push(inner),
            "AExpr" => compared(inner, &mut taken_apart),
            "SubLink" => taken_apart.extend(row(inner.get("testexpr"))),
            "MultiAssignRef" => taken_apart.extend(row(inner.get("source"))),
            "SelectStmt" => grouped(inner, &mut taken_apart),
            _ => {}
        }
    }
    if rows.iter().all(|r| taken_apart.contains(r)) {
        return Ok(());
    }
    Err(forbidden(
        "a row constructor (`(a, b)`, `ROW(a, b)`) is allowed only where PostgreSQL compares it column by \
         column: `(a, b) = (c, d)` (or <>, <, <=, >, >=, IS [NOT] DISTINCT FROM), `(a, b) = (SELECT ...)`, \
         `SET (a, b) = (...)` and `GROUP BY (a, b)`; \
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
    if !matches!(kind, Some(K::AexprOp | K::AexprDistinct | K::AexprNotDistinct)) {
        return;
    }
    match (row(expr.get("lexpr")), row(expr.get("rexpr"))) {
        (Some(left), Some(right)) => taken_apart.extend([left, right]),
        // `(a, b) = (SELECT x, y ...)`: PostgreSQL makes it a row
        // comparison with the subquery's columns (`transformAExprOp`).
        (Some(left), None) if one_value_subquery(expr.get("rexpr")) && kind == Some(K::AexprOp) => {
            taken_apart.insert(left);
        }
        _ => {}
    }
}

/// Whether `node` is a subquery written where one value goes (`(SELECT ...)`).
fn one_value_subquery(node: Option<&Value>) -> bool {
    use pg_query::protobuf::SubLinkType;
    node.and_then(|n| n.get("node"))
        .and_then(|n| n.get("SubLink"))
        .and_then(|s| s.get("sub_link_type"))
        .and_then(Value::as_i64)
        == Some(SubLinkType::ExprSublink as i64)
}

/// `GROUP BY (a, b)`: PostgreSQL groups by each column of a row written
/// without `ROW` at the top of the list (`flatten_grouping_sets`).
fn grouped(select: &Value, taken_apart: &mut HashSet<*const Value>) {
    use pg_query::protobuf::CoercionForm;
    let items = select.get("group_clause").and_then(Value::as_array);
    for item in items.into_iter().flatten() {
        let Some(row_expr) = item.get("node").and_then(|n| n.get("RowExpr")) else {
            continue;
        };
        if row_expr.get("row_format").and_then(Value::as_i64) == Some(CoercionForm::CoerceImplicitCast as i64)
        {
            taken_apart.insert(row_expr as *const Value);
        }
    }
}
