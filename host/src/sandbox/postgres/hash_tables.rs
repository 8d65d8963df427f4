//! Hash tables PostgreSQL 15 keeps in memory whatever `work_mem` says
//! (the seventeenth adversarial read, issue 23): the syntax that makes them
//! is refused, since nothing a statement does can bound them.

use crate::sandbox::guard::{Refusal, forbidden};
use serde_json::Value;

/// Regression (the seventeenth adversarial read, issue 23): PostgreSQL 15
/// keeps some hash tables in memory whatever `work_mem` says. A hashed
/// `x IN (SELECT ...)` (or `op ANY / ALL (SELECT ...)`), `EXCEPT` and
/// `INTERSECT`, and the duplicate check of a recursive `UNION`, grew one
/// backend by 150-420 MB a second until the kernel would kill it (and the
/// postmaster every team's sessions with it). EXISTS and UNION ALL do the
/// same jobs without them.
const IN_SUBQUERY_REFUSED: &str = "x IN (SELECT ...), and op ANY / ALL / SOME (SELECT ...), are not allowed: \
     PostgreSQL may hash the subquery's rows in memory with no bound; write EXISTS (SELECT 1 FROM ... WHERE ...)";

pub(super) fn check_sublink(node: &Value) -> Result<(), Refusal> {
    use pg_query::protobuf::SubLinkType as S;
    let kind = node
        .get("sub_link_type")
        .and_then(Value::as_i64)
        .unwrap_or_default();
    let kind = i32::try_from(kind).ok().and_then(|k| S::try_from(k).ok());
    match kind {
        Some(S::AnySublink | S::AllSublink | S::RowcompareSublink) => Err(forbidden(IN_SUBQUERY_REFUSED)),
        _ => Ok(()),
    }
}

fn set_operation(node: &Value) -> Option<pg_query::protobuf::SetOperation> {
    let op = node.get("op").and_then(Value::as_i64)?;
    i32::try_from(op)
        .ok()
        .and_then(|op| pg_query::protobuf::SetOperation::try_from(op).ok())
}

pub(super) fn check_set_operation(node: &Value) -> Result<(), Refusal> {
    use pg_query::protobuf::SetOperation as O;
    match set_operation(node) {
        Some(O::SetopExcept | O::SetopIntersect) => Err(forbidden(
            "EXCEPT and INTERSECT are not allowed: PostgreSQL builds their hash table in memory with no \
             bound; write NOT EXISTS or EXISTS",
        )),
        _ => Ok(()),
    }
}

/// A recursive CTE's `UNION` (without ALL) keeps every row it made in a
/// hash table, in memory, to drop duplicates.
pub(super) fn check_recursive_union(node: &Value) -> Result<(), Refusal> {
    if !node.get("recursive").and_then(Value::as_bool).unwrap_or(false) {
        return Ok(());
    }
    let ctes = node.get("ctes").and_then(Value::as_array).into_iter().flatten();
    for cte in ctes {
        let body = cte.pointer("/node/CommonTableExpr/ctequery/node/SelectStmt");
        let distinct_union = body.is_some_and(|b| {
            set_operation(b) == Some(pg_query::protobuf::SetOperation::SetopUnion)
                && !b.get("all").and_then(Value::as_bool).unwrap_or(false)
        });
        if distinct_union {
            return Err(forbidden(
                "a recursive CTE's UNION must be UNION ALL: UNION keeps every row it made in a hash table, \
                 in memory, with no bound",
            ));
        }
    }
    Ok(())
}
