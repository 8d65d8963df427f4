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

/// What one top-N sort may hold: its rows times the tables each row comes
/// from times `limits.max_row_bytes` (every stored row is at most that).
pub(super) const SORT_BUDGET_BYTES: u64 = 128 << 20;

/// Regression (the eighteenth adversarial read and its review, issue 23):
/// under a LIMIT, PostgreSQL sorts in a bounded heap that stays in memory
/// once its first rows fit, whatever size the later ones are (2,000 rows of
/// a 1 MiB value held 2 GB in one backend; 100 rows of 16 such columns, 1.6
/// GB), and it hands an outer LIMIT down to a sort in a subquery, a UNION
/// branch, an inlined CTE or a view. So:
/// - ORDER BY stands only in a statement's own query (or an INSERT's), or
///   with a LIMIT of its own;
/// - a sort under a LIMIT sorts rows of tables (not of a subquery, a table
///   function or a UNION), LIMIT and OFFSET are integer literals, at most
///   [`MAX_SORTED_LIMIT`] rows, and rows x the values a row may hold
///   ([`sorted_row_values`]) x `max_row_bytes` at most [`SORT_BUDGET_BYTES`].
pub(super) fn check_sorts(tree: &Value, row_bytes: u64) -> Result<(), Refusal> {
    let statements = tree.get("stmts").and_then(Value::as_array).into_iter().flatten();
    let own: Vec<*const Value> = statements
        .flat_map(|s| {
            [
                s.pointer("/stmt/node/SelectStmt"),
                s.pointer("/stmt/node/InsertStmt/select_stmt/node/SelectStmt"),
            ]
        })
        .flatten()
        .map(|v| v as *const Value)
        .collect();
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(select) = fields.get("SelectStmt") {
                    check_sort(select, own.contains(&(select as *const Value)), row_bytes)?;
                    // A UNION's branches are SelectStmts written without the
                    // node's name, and never a statement's own query.
                    for branch in ["larg", "rarg"].iter().filter_map(|k| select.get(*k)) {
                        if branch.is_object() {
                            check_sort(branch, false, row_bytes)?;
                        }
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_sort(select: &Value, own_query: bool, row_bytes: u64) -> Result<(), Refusal> {
    let sorted = select
        .get("sort_clause")
        .and_then(Value::as_array)
        .is_some_and(|s| !s.is_empty());
    // The tree writes an absent clause as null.
    let clause = |key| select.get(key).filter(|v| !v.is_null());
    let limit = match (sorted, clause("limit_count")) {
        (false, _) => return Ok(()),
        (true, None) if own_query => return Ok(()),
        (true, None) => {
            return Err(forbidden(
                "ORDER BY in a subquery, a CTE, a view or a UNION branch needs a LIMIT of its own: \
                 PostgreSQL hands an outer LIMIT down to it and keeps that many rows in memory, \
                 whatever their size; sort in the statement's own query",
            ));
        }
        (true, Some(limit)) => limit,
    };
    let literal_rows = || {
        let offset = match clause("limit_offset") {
            Some(offset) => literal(offset)?,
            None => 0,
        };
        let limit = literal(limit)?;
        (limit >= 0 && offset >= 0)
            .then(|| limit.checked_add(offset))
            .flatten()
    };
    let rows = literal_rows().filter(|rows| *rows <= MAX_SORTED_LIMIT).ok_or_else(|| {
        forbidden(format!(
            "ORDER BY with LIMIT must take integer literals, LIMIT plus OFFSET at most {MAX_SORTED_LIMIT}: \
             PostgreSQL keeps that many sorted rows in memory whatever their size"
        ))
    })?;
    let values = sorted_row_values(select).ok_or_else(|| {
        forbidden(
            "ORDER BY with LIMIT may sort only rows of tables (not of a subquery, a table function \
             or a UNION): PostgreSQL keeps the sorted rows in memory whatever their size; sort \
             the tables themselves, or sort without LIMIT",
        )
    })?;
    let bytes = (rows as u64).saturating_mul(values).saturating_mul(row_bytes);
    if bytes > SORT_BUDGET_BYTES {
        return Err(Refusal::Limit(format!(
            "ORDER BY with LIMIT {rows} keeps up to {} MiB in memory (each row holds up to {values} \
             values of limits.max_row_bytes = {row_bytes}: one per table, parameter, call and \
             operator); at most {} MiB: lower the LIMIT, select fewer computed values, or lower \
             limits.max_row_bytes",
            bytes >> 20,
            SORT_BUDGET_BYTES >> 20
        )));
    }
    Ok(())
}

/// How many values of up to `max_row_bytes` a sorted row may hold: one per
/// table it reads (a stored row is at most that), and for each computed
/// column or sort key one per parameter, call, operator, CASE and subquery in
/// it (each makes a value of at most about that). `None`: its rows do not
/// come from tables alone (a subquery, a table function, a UNION).
fn sorted_row_values(select: &Value) -> Option<u64> {
    let op = select.get("op").and_then(Value::as_i64).unwrap_or_default();
    if op != pg_query::protobuf::SetOperation::SetopNone as i64 {
        return None;
    }
    let mut values = 0u64;
    let mut from: Vec<&Value> = list(select, "from_clause").collect();
    while let Some(item) = from.pop() {
        let node = item.get("node")?;
        if node.get("RangeVar").is_some() {
            values += 1;
        } else if let Some(join) = node.get("JoinExpr") {
            from.extend([join.get("larg")?, join.get("rarg")?]);
        } else {
            return None;
        }
    }
    let targets = list(select, "target_list").filter_map(|t| t.pointer("/node/ResTarget/val"));
    let keys = list(select, "sort_clause").filter_map(|k| k.pointer("/node/SortBy/node"));
    for item in targets.chain(keys) {
        values = values.saturating_add(value_makers(item));
    }
    Some(values.max(1))
}

fn list<'a>(node: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    node.get(key).and_then(Value::as_array).into_iter().flatten()
}

/// The nodes under `item` that make a value of their own.
fn value_makers(item: &Value) -> u64 {
    const MAKERS: &[&str] = &[
        "ParamRef",
        "FuncCall",
        "AExpr",
        "CaseExpr",
        "CoalesceExpr",
        "MinMaxExpr",
        "TypeCast",
        "SubLink",
        "AArrayExpr",
        "RowExpr",
    ];
    let mut count = 0u64;
    let mut stack = vec![item];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                count += fields.keys().filter(|k| MAKERS.contains(&k.as_str())).count() as u64;
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    count
}

/// Regression (the review of the eighteenth adversarial read, issue 23):
/// with `enable_hashjoin = off`, PostgreSQL 15 still plans a FULL JOIN as a
/// hash join when the other side looks large enough, and its hash table
/// over one repeated key never spills (803 MB from 2,000 rows).
pub(super) fn check_join(node: &Value) -> Result<(), Refusal> {
    let kind = node.get("jointype").and_then(Value::as_i64).unwrap_or_default();
    if kind == pg_query::protobuf::JoinType::JoinFull as i64 {
        return Err(forbidden(
            "FULL JOIN is not allowed: PostgreSQL may hash it in memory with no bound; write a LEFT \
             JOIN, and UNION ALL the other side's rows WHERE NOT EXISTS a match",
        ));
    }
    Ok(())
}

/// An integer literal's value (protobuf leaves out a zero).
fn literal(node: &Value) -> Option<i64> {
    let constant = node.get("node")?.get("AConst")?;
    let ival = constant.get("val")?.get("Ival")?;
    Some(ival.get("ival").and_then(Value::as_i64).unwrap_or(0))
}
