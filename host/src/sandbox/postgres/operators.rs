//! Operator expressions as PostgreSQL reads them: which operators a
//! handler may use, and the forms PostgreSQL reads in ways that cost more
//! than they look (an untyped literal typed by its context, operands copied
//! while the statement is read).

use super::{OPERATORS, catalog_name, forbidden, strings};
use crate::sandbox::guard::Refusal;
use serde_json::Value;

pub(super) fn check_operator_expr(node: &Value) -> Result<(), Refusal> {
    let kind = node.get("kind").and_then(Value::as_i64).unwrap_or_default();
    let kind = i32::try_from(kind)
        .ok()
        .and_then(|k| pg_query::protobuf::AExprKind::try_from(k).ok());
    use pg_query::protobuf::AExprKind as K;
    match kind {
        Some(K::AexprOp)
            if operator_is(node, "-")
                && [node.get("lexpr"), node.get("rexpr")]
                    .into_iter()
                    .any(untyped_string) =>
        {
            Err(forbidden(
                "an untyped string literal beside `-` is not allowed on PostgreSQL: with a text on the other \
                 side it is read as jsonb (see jsonb); cast it, as in `CAST('2024-01-01' AS date) - 1`",
            ))
        }
        Some(K::AexprOp | K::AexprOpAny | K::AexprOpAll) => check_operator_name(node.get("name")),
        Some(K::AexprLike | K::AexprIlike) => Err(forbidden(
            "LIKE and ILIKE are not allowed: one call's time grows with both lengths and PostgreSQL does not \
             interrupt it at the event's deadline",
        )),
        // Their operator is the grammar's `=` or `<>`, or BETWEEN's own word.
        Some(K::AexprDistinct | K::AexprNotDistinct | K::AexprNullif) => Ok(()),
        Some(
            copying @ (K::AexprIn
            | K::AexprBetween
            | K::AexprNotBetween
            | K::AexprBetweenSym
            | K::AexprNotBetweenSym),
        ) => check_copied_operands(node, copying),
        Some(K::AexprSimilar) => Err(forbidden("SIMILAR TO (a regular expression) is not allowed")),
        _ => Err(forbidden("this kind of operator expression is not allowed")),
    }
}

/// Regression (the review of the nineteenth adversarial read, issue 23):
/// while it reads a statement, PostgreSQL writes `a BETWEEN b AND c` as
/// `a >= b AND a <= c` with a copy of `a` (SYMMETRIC: four copies of `a` and
/// two of `b` and `c`), and `a IN (x, y)` as `a = x OR a = y` with a copy of
/// `a` per item that reads a column (or per item when `a` is a row), with
/// no interrupt check: nested, `((a BETWEEN ...) BETWEEN ...) ...` is 2^d
/// copies. So what it copies must be a column, a parameter or a literal.
fn check_copied_operands(node: &Value, kind: pg_query::protobuf::AExprKind) -> Result<(), Refusal> {
    use pg_query::protobuf::AExprKind as K;
    fn simple(node: Option<&Value>) -> bool {
        let Some(inner) = node.and_then(|n| n.get("node")) else {
            return false;
        };
        if let Some(cast) = inner.get("TypeCast") {
            return simple(cast.get("arg"));
        }
        ["ColumnRef", "ParamRef", "AConst"]
            .iter()
            .any(|k| inner.get(*k).is_some())
    }
    fn constant(node: &Value) -> bool {
        let Some(inner) = node.get("node") else {
            return false;
        };
        if let Some(cast) = inner.get("TypeCast") {
            return cast.get("arg").is_some_and(constant);
        }
        ["ParamRef", "AConst"].iter().any(|k| inner.get(*k).is_some())
    }
    let left = node.get("lexpr");
    let items: Vec<&Value> = node
        .pointer("/rexpr/node/List/items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let copied = match kind {
        K::AexprBetween | K::AexprNotBetween => !simple(left),
        K::AexprBetweenSym | K::AexprNotBetweenSym => !simple(left) || !items.iter().all(|i| simple(Some(i))),
        // Literals and parameters become one `= ANY (array)`, without a copy.
        _ => {
            let row = left.and_then(|l| l.pointer("/node/RowExpr")).is_some();
            !simple(left) && (row || !items.iter().all(|i| constant(i)))
        }
    };
    if copied {
        return Err(forbidden(
            "the left side of BETWEEN (every side of BETWEEN SYMMETRIC), and of IN (...) over items that \
             read columns, must be a column, a parameter or a literal: PostgreSQL copies it for each \
             comparison while it reads the statement, and copies of copies grow without bound; compare a \
             column, or write the comparisons out",
        ));
    }
    Ok(())
}

/// True if the operator expression's operator is `op` (or `pg_catalog.op`).
fn operator_is(node: &Value, op: &str) -> bool {
    catalog_name(&strings(node.get("name"))) == Some(op)
}

/// Regression (the eleventh adversarial read, issue 23): a string literal
/// without a cast is of no type until its context gives it one, and
/// `'[...]' - 'x'::text` made it jsonb (a tree of ~1 MB per call, held until
/// the row ends).
fn untyped_string(operand: Option<&Value>) -> bool {
    operand
        .and_then(|o| o.get("node"))
        .and_then(|n| n.get("AConst"))
        .and_then(|c| c.get("val"))
        .is_some_and(|v| v.get("Sval").is_some())
}

pub(super) fn check_operator_name(name: Option<&Value>) -> Result<(), Refusal> {
    let parts = strings(name);
    if parts.is_empty() {
        return Ok(());
    }
    match catalog_name(&parts) {
        Some(op) if OPERATORS.contains(&op) => Ok(()),
        _ => Err(forbidden(format!(
            "operator {} is not allowed: handlers may use only comparison, arithmetic, concatenation, LIKE and \
             JSON operators ({})",
            parts.join("."),
            OPERATORS.join(" ")
        ))),
    }
}
