//! What PostgreSQL 15 keeps in memory whatever `work_mem` says (the
//! seventeenth and eighteenth adversarial reads, issue 23): some hash tables,
//! and the rows a top-N sort holds. The syntax that makes them is refused,
//! or bounded, since nothing else a statement does can bound them. (A hash
//! join that cannot split its batches is the other such case; handler
//! sessions run with `enable_hashjoin = off`, see `db::logins`.)

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

/// The most rows `ORDER BY ... LIMIT n OFFSET m` may keep (n + m).
pub(super) const MAX_SORTED_LIMIT: i64 = 100;

/// Regression (the eighteenth adversarial read, issue 23): under ORDER BY,
/// PostgreSQL sorts LIMIT + OFFSET rows in a bounded heap, in memory once
/// its first rows fit, whatever size the later ones are: 2,000 rows of a
/// 1 MiB value held 2 GB in one backend. The bound must be a small literal.
pub(super) fn check_sorted_limit(node: &Value) -> Result<(), Refusal> {
    let sorted = node
        .get("sort_clause")
        .and_then(Value::as_array)
        .is_some_and(|s| !s.is_empty());
    // The tree writes an absent clause as null.
    let clause = |key| node.get(key).filter(|v| !v.is_null());
    let (Some(limit), true) = (clause("limit_count"), sorted) else {
        return Ok(());
    };
    let refused = || {
        forbidden(format!(
            "ORDER BY with LIMIT must take an integer literal, LIMIT plus OFFSET at most {MAX_SORTED_LIMIT}: \
             PostgreSQL keeps that many sorted rows in memory whatever their size"
        ))
    };
    let offset = match clause("limit_offset") {
        Some(offset) => literal(offset).ok_or_else(refused)?,
        None => 0,
    };
    let limit = literal(limit).ok_or_else(refused)?;
    match limit.checked_add(offset) {
        Some(rows) if (0..=MAX_SORTED_LIMIT).contains(&rows) && limit >= 0 && offset >= 0 => Ok(()),
        _ => Err(refused()),
    }
}

/// An integer literal's value (protobuf leaves out a zero).
fn literal(node: &Value) -> Option<i64> {
    let constant = node.get("node")?.get("AConst")?;
    let ival = constant.get("val")?.get("Ival")?;
    Some(ival.get("ival").and_then(Value::as_i64).unwrap_or(0))
}
