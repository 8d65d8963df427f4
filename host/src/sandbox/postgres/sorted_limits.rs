//! Sorts under a LIMIT (the eighteenth adversarial read and its reviews,
//! issue 23): PostgreSQL sorts in a bounded heap that stays in memory once
//! its first rows fit, whatever size the later ones are, and hands an outer
//! LIMIT down to a nested sort. What such a sort may hold is bounded here.

use super::unspilled::{
    call_name, check_grouped_extremes, check_set_operation, list, relation_names, set_operation,
};
use crate::sandbox::guard::{Refusal, forbidden};
use crate::sandbox::work::{VALUE_ROWS, VIEW_ROWS};
use pg_query::protobuf::SetOperation;
use serde_json::Value;

/// The most rows `ORDER BY ... LIMIT n OFFSET m` may keep (n + m).
pub(super) const MAX_SORTED_LIMIT: i64 = 100;

/// What a statement's top-N sorts may hold together: each one's rows times
/// the values a row may hold ([`sorted_row_values`]) times
/// `limits.max_row_bytes`. At the default 1 MiB, 64 rows of one table.
pub(super) const SORT_BUDGET_BYTES: u64 = 256 << 20;

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
///   ([`sorted_row_values`]) x `max_row_bytes`, summed over the statement's
///   sorts (each keeps its rows until the statement ends), at most
///   [`SORT_BUDGET_BYTES`].
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
    let ctes = cte_names(tree);
    // Every bounded sort of a statement keeps its rows until the statement ends.
    let mut held = 0u64;
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(select) = fields.get("SelectStmt") {
                    // A set operation's branches are SelectStmts written
                    // without the node's name, at any depth (`a UNION ALL b
                    // UNION ALL c` nests to the left), and never a statement's
                    // own query.
                    let mut selects = vec![(select, own.contains(&(select as *const Value)))];
                    let mut i = 0;
                    while i < selects.len() {
                        let branches = ["larg", "rarg"].iter().filter_map(|k| selects[i].0.get(*k));
                        let branches: Vec<_> =
                            branches.filter(|b| b.is_object()).map(|b| (b, false)).collect();
                        selects.extend(branches);
                        i += 1;
                    }
                    for (select, own_query) in selects {
                        check_set_operation(select)?;
                        check_grouped_extremes(select)?;
                        let bytes = check_sort(select, own_query, row_bytes, &ctes)?;
                        held = held.saturating_add(bytes);
                    }
                    if held > SORT_BUDGET_BYTES {
                        return Err(Refusal::Limit(format!(
                            "this statement's sorts under a LIMIT keep up to {} MiB in memory together; \
                             at most {} MiB: fewer or smaller LIMITs, fewer computed values, or a lower \
                             limits.max_row_bytes",
                            held >> 20,
                            SORT_BUDGET_BYTES >> 20
                        )));
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    Ok(())
}

/// Every CTE the statement defines, by name, and whether its body is a set
/// operation: a reference to one reads a computed row, not a stored one.
pub(super) fn cte_names(tree: &Value) -> Vec<(String, bool)> {
    let mut names = Vec::new();
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(cte) = fields.get("CommonTableExpr")
                    && let Some(name) = cte.get("ctename").and_then(Value::as_str)
                {
                    let body = cte.pointer("/ctequery/node/SelectStmt");
                    let set = body
                        .is_some_and(|b| set_operation(b).is_some_and(|op| op != SetOperation::SetopNone));
                    names.push((name.to_owned(), set));
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    names
}

/// Checks one query's sort; returns what its bounded sort may hold, in bytes.
fn check_sort(
    select: &Value,
    own_query: bool,
    row_bytes: u64,
    ctes: &[(String, bool)],
) -> Result<u64, Refusal> {
    let sorted = select
        .get("sort_clause")
        .and_then(Value::as_array)
        .is_some_and(|s| !s.is_empty());
    // The tree writes an absent clause as null.
    let clause = |key| select.get(key).filter(|v| !v.is_null());
    let limit = match (sorted, clause("limit_count")) {
        (false, _) => return Ok(0),
        (true, None) if own_query => return Ok(0),
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
    let values = sorted_row_values(select, ctes).ok_or_else(|| {
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
             values of limits.max_row_bytes = {row_bytes}: 4 per table or view, 64 per CTE, and per \
             computed column one per parameter, call and operator and 4 per column it reads); at \
             most {} MiB: lower the LIMIT, select fewer computed values, or lower limits.max_row_bytes",
            bytes >> 20,
            SORT_BUDGET_BYTES >> 20
        )));
    }
    Ok(bytes)
}

/// How many values of up to `max_row_bytes` a sorted row may hold, by the
/// work model's own bounds (`sandbox::work`): a table's or view's row is
/// [`VIEW_ROWS`] of them and a CTE's [`VALUE_ROWS`]; a computed column or
/// sort key adds one per parameter, call, operator, CASE and subquery in it,
/// and one row's worth per column it reads (`concat(v, v, v)` is three `v`s).
/// `None`: its rows do not come from tables or CTEs alone (a subquery, a
/// table function, a UNION).
fn sorted_row_values(select: &Value, ctes: &[(String, bool)]) -> Option<u64> {
    let op = select.get("op").and_then(Value::as_i64).unwrap_or_default();
    if op != pg_query::protobuf::SetOperation::SetopNone as i64 {
        return None;
    }
    let mut values = 0u64;
    let mut widest = VIEW_ROWS;
    let mut from: Vec<&Value> = list(select, "from_clause").collect();
    while let Some(item) = from.pop() {
        let node = item.get("node")?;
        if let Some(relation) = node.get("RangeVar") {
            let name = relation
                .get("relname")
                .and_then(Value::as_str)
                .unwrap_or_default();
            // Unqualified (the tree writes no schema as ""), and a CTE's name.
            let schema = relation
                .get("schemaname")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let cte = ctes
                .iter()
                .find(|(c, _)| schema.is_empty() && c.eq_ignore_ascii_case(name));
            // A CTE of a UNION: PostgreSQL may sort each branch under the
            // LIMIT (a Merge Append), one bounded sort per branch.
            if cte.is_some_and(|(_, set)| *set) {
                return None;
            }
            let row = if cte.is_some() { VALUE_ROWS } else { VIEW_ROWS };
            widest = widest.max(row);
            values = values.saturating_add(row);
        } else if let Some(join) = node.get("JoinExpr") {
            from.extend([join.get("larg")?, join.get("rarg")?]);
        } else {
            return None;
        }
    }
    let relations = relation_names(select);
    let targets = list(select, "target_list").filter_map(|t| t.pointer("/node/ResTarget/val"));
    let keys = list(select, "sort_clause").filter_map(|k| k.pointer("/node/SortBy/node"));
    for item in targets.chain(keys) {
        // A whole row (`t`, `t.*`, `*`) is copied into the sort in full,
        // once per time it is named.
        if whole_row(item, &relations) {
            values = values.saturating_add(widest);
            continue;
        }
        let (makers, columns, inner_columns) = value_makers(item);
        if makers > 0 {
            values = values
                .saturating_add(makers)
                .saturating_add(columns.saturating_mul(widest))
                .saturating_add(inner_columns.saturating_mul(VALUE_ROWS));
        }
    }
    Some(values.max(1))
}

/// Whether a target or sort key names a whole row: `*`, `x.*`, or a bare
/// name of one of the query's relations.
fn whole_row(item: &Value, relations: &[String]) -> bool {
    let Some(fields) = item.pointer("/node/ColumnRef/fields").and_then(Value::as_array) else {
        return false;
    };
    let star = fields.iter().any(|f| f.pointer("/node/AStar").is_some());
    let bare = match fields.as_slice() {
        [only] => only
            .pointer("/node/String/sval")
            .and_then(Value::as_str)
            .is_some_and(|name| relations.iter().any(|r| r.eq_ignore_ascii_case(name))),
        _ => false,
    };
    star || bare
}

/// The nodes under `item` that make a value of their own, the column
/// references under it, and those of them inside a subquery.
///
/// Regression (the third review of the eighteenth read, issue 23, C5): a
/// subquery's columns may be a CTE's, whose rows are computed
/// ([`VALUE_ROWS`] values), while this query's FROM held only tables: such
/// a column counts as a CTE's, whatever the subquery reads.
fn value_makers(item: &Value) -> (u64, u64, u64) {
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
    let (mut makers, mut columns, mut inner_columns) = (0u64, 0u64, 0u64);
    let mut stack = vec![(item, false)];
    while let Some((value, in_subquery)) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, in_subquery))),
            Value::Object(fields) => {
                makers += fields.keys().filter(|k| MAKERS.contains(&k.as_str())).count() as u64;
                if fields.contains_key("ColumnRef") {
                    *(if in_subquery {
                        &mut inner_columns
                    } else {
                        &mut columns
                    }) += 1;
                }
                if let Some(call) = fields.get("FuncCall") {
                    makers = makers.saturating_add(call_weight(call));
                }
                let inner = in_subquery || fields.contains_key("SubLink");
                stack.extend(fields.values().map(|v| (v, inner)));
            }
            _ => {}
        }
    }
    (makers, columns, inner_columns)
}

/// What a call's value may be beside its arguments', in values: a call can
/// repeat an argument once per other argument (`concat_ws(sep, ...)`), and
/// JSON builders escape each character into as many as six.
fn call_weight(call: &Value) -> u64 {
    let args = list(call, "args").count() as u64;
    let name = call_name(call);
    let escapes =
        if name.starts_with("json") || name.starts_with("to_json") || name.starts_with("row_to_json") {
            6
        } else {
            1
        };
    args.max(1).saturating_mul(escapes)
}

/// An integer literal's value (protobuf leaves out a zero).
fn literal(node: &Value) -> Option<i64> {
    let constant = node.get("node")?.get("AConst")?;
    let ival = constant.get("val")?.get("Ival")?;
    Some(ival.get("ival").and_then(Value::as_i64).unwrap_or(0))
}
