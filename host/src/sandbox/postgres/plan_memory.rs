//! What a statement's plan may hold in memory through `work_mem` (the
//! nineteenth adversarial read, issue 23). PostgreSQL gives `work_mem` to
//! each node of a plan that sorts, materializes or stores rows, not to the
//! statement: 700 aggregates with ORDER BY held 2.8 GB in one backend, and
//! 300 functions in FROM, each a tuplestore, 1.4 GB. So the nodes a
//! statement can make are counted here and bounded, and what multiplies
//! them behind the guard's back is refused: a CTE written `NOT
//! MATERIALIZED` is copied into every place that reads it (19 CTEs each
//! reading the one before twice planned 2^18 copies: 2.5 GB while planning),
//! and a bare `*` over many relations is one row of all their columns.

use super::unspilled::list;
use crate::sandbox::guard::{Refusal, forbidden};
use crate::sandbox::work::{VALUE_ROWS, VIEW_ROWS};
use serde_json::{Map, Value};
use std::rc::Rc;

/// The most plan nodes that may each hold `work_mem` (1 MB in a handler's
/// sessions, see `db::logins`), one statement's: 256 MB at most.
pub(super) const MAX_MEMORY_NODES: u64 = 256;

/// What one name in FROM counts: it may be a view of up to [`VIEW_ROWS`]
/// relations, and each relation is a join input that the planner may sort
/// (a merge join) and materialize (a nested loop).
const RELATION_NODES: u64 = 2 * VIEW_ROWS;

/// A function, subquery or VALUES in FROM: one input, sorted and materialized.
const FROM_ITEM_NODES: u64 = 2;

/// Checks the whole statement: its memory nodes (with `copied`, those the
/// planner's copies of derived columns add: `sandbox::work::check`), its
/// CTEs' materialization, and each query's `*`.
pub(super) fn check(tree: &Value, copied: u64) -> Result<(), Refusal> {
    let nodes = count(tree, RELATION_NODES)?.saturating_add(copied);
    if nodes > MAX_MEMORY_NODES {
        return Err(Refusal::Limit(format!(
            "this statement may make up to {nodes} plan nodes that each hold up to work_mem (sorts, \
             materialized or stored rows: {RELATION_NODES} per table or view, {FROM_ITEM_NODES} per \
             function, subquery or CTE in FROM, one per ORDER BY key, DISTINCT, GROUP BY, window, CTE \
             and subquery, and again in each copy the planner makes of a subquery's or CTE's column \
             for every reference to it); at most {MAX_MEMORY_NODES}: split the statement"
        )));
    }
    Ok(())
}

/// Regression (the review of the nineteenth adversarial read, issue 23): a
/// reference to a view counts [`RELATION_NODES`], but the planner puts the
/// view's whole query in its place: seven EXISTS over four tables each in
/// a view's WHERE made 32 references 1,600 sorts. So a view's own nodes,
/// each table it reads one input, may be no more than that.
pub(super) fn check_view(tree: &Value) -> Result<(), Refusal> {
    let nodes = count(tree, FROM_ITEM_NODES)?;
    if nodes > RELATION_NODES {
        return Err(Refusal::Limit(format!(
            "this view may make up to {nodes} plan nodes that each hold up to work_mem in every \
             statement that reads it ({FROM_ITEM_NODES} per table, one per subquery), and a statement \
             counts a view as {RELATION_NODES}: read at most {VIEW_ROWS} tables, and put the rest of \
             the filter in the statements that read it"
        )));
    }
    Ok(())
}

/// The memory nodes of a statement, each name in FROM (not a CTE's) counted
/// `relation`; checks each query's `*` on the way.
fn count(tree: &Value, relation: u64) -> Result<u64, Refusal> {
    let mut nodes = 0u64;
    // Each value with the CTE names visible where it stands.
    let mut stack = vec![(tree, Rc::new(Vec::new()))];
    while let Some((value, scope)) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, scope.clone()))),
            Value::Object(fields) => {
                let scope = with_scope(value, &scope);
                for (kind, node) in fields {
                    if matches!(kind.as_str(), "UpdateStmt" | "DeleteStmt" | "InsertStmt") {
                        check_returning_star(node, &with_scope(node, &scope))?;
                    }
                    if kind == "SelectStmt" {
                        // A set operation's branches are SelectStmts written
                        // without the node's name, at any depth.
                        let mut selects = vec![(node, scope.clone())];
                        while let Some((select, outer)) = selects.pop() {
                            let scope = with_scope(select, &outer);
                            nodes = nodes.saturating_add(select.as_object().map_or(0, query_weight));
                            check_star(select, &scope)?;
                            let branches = ["larg", "rarg"].iter().filter_map(|k| select.get(*k));
                            selects.extend(branches.filter(|b| b.is_object()).map(|b| (b, scope.clone())));
                        }
                    } else {
                        nodes = nodes.saturating_add(node_weight(kind, node, &scope, relation)?);
                    }
                }
                for (key, child) in fields {
                    match (key.as_str(), child.get("ctes").and_then(Value::as_array)) {
                        ("with_clause", Some(ctes)) => {
                            stack.extend(cte_scopes(child, ctes, &scope));
                        }
                        _ => stack.push((child, scope.clone())),
                    }
                }
            }
            _ => {}
        }
    }
    Ok(nodes)
}

/// The memory nodes one parse node may make in the plan, in this statement.
fn node_weight(kind: &str, node: &Value, ctes: &[String], relation: u64) -> Result<u64, Refusal> {
    if kind == "CommonTableExpr" {
        check_materialized(node)?;
    }
    Ok(match (kind, node.as_object()) {
        // A CTE's name (unqualified) is one stored input, not a view.
        ("RangeVar", _) if is_cte(node, ctes) => FROM_ITEM_NODES,
        ("RangeVar", _) => relation,
        (_, Some(node)) => weight(kind, node),
        (_, None) => 0,
    })
}

/// The memory nodes one parse node other than a query may make in the plan
/// (a name in FROM counted as a table's or view's). `sandbox::work` counts
/// them in the expressions the planner copies, too.
pub(in crate::sandbox) fn weight(kind: &str, node: &Map<String, Value>) -> u64 {
    match kind {
        "RangeVar" => RELATION_NODES,
        "RangeFunction" | "RangeSubselect" | "RangeTableFunc" | "RangeTableSample" => FROM_ITEM_NODES,
        // An ORDER BY key of a query, an aggregate or a window: a sort.
        "SortBy" | "WindowDef" | "SubLink" | "CommonTableExpr" => 1,
        // DISTINCT in an aggregate sorts; so does a window written in place.
        "FuncCall" => {
            let distinct = node.get("agg_distinct").and_then(Value::as_bool) == Some(true);
            let window = node.get("over").is_some_and(|o| !o.is_null());
            u64::from(distinct) + u64::from(window)
        }
        _ => 0,
    }
}

/// The CTE names visible in a query (or statement) and below it: those
/// around it, and its own WITH's.
fn with_scope(query: &Value, outer: &Rc<Vec<String>>) -> Rc<Vec<String>> {
    let ctes = query.pointer("/with_clause/ctes").and_then(Value::as_array);
    match ctes {
        Some(ctes) if !ctes.is_empty() => {
            let mut scope = outer.as_ref().clone();
            scope.extend(ctes.iter().filter_map(cte_name));
            Rc::new(scope)
        }
        _ => outer.clone(),
    }
}

/// Each CTE of a WITH with the names its body sees: the CTEs before it (all
/// of them, itself included, in a WITH RECURSIVE). Regression (the review
/// of the nineteenth adversarial read, issue 23): a table named like a CTE
/// defined elsewhere counted as a stored CTE's two nodes, not a view's eight.
fn cte_scopes<'a>(
    with: &'a Value,
    ctes: &'a [Value],
    statement: &Rc<Vec<String>>,
) -> Vec<(&'a Value, Rc<Vec<String>>)> {
    let recursive = with.get("recursive").and_then(Value::as_bool) == Some(true);
    // `statement` already holds this WITH's names at its end.
    let outer = &statement[..statement.len().saturating_sub(ctes.len())];
    (0..ctes.len())
        .map(|i| {
            let seen = if recursive { ctes.len() } else { i };
            let mut scope = outer.to_vec();
            scope.extend(ctes[..seen].iter().filter_map(cte_name));
            (&ctes[i], Rc::new(scope))
        })
        .collect()
}

fn cte_name(cte: &Value) -> Option<String> {
    cte.pointer("/node/CommonTableExpr/ctename")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn is_cte(relation: &Value, ctes: &[String]) -> bool {
    let text = |k: &str| relation.get(k).and_then(Value::as_str).unwrap_or_default();
    text("schemaname").is_empty() && ctes.iter().any(|c| c.eq_ignore_ascii_case(text("relname")))
}

/// A query's own DISTINCT, GROUP BY and set operation: each a sort.
pub(in crate::sandbox) fn query_weight(select: &Map<String, Value>) -> u64 {
    let set = |key: &str| {
        select
            .get(key)
            .and_then(Value::as_array)
            .is_some_and(|items| !items.is_empty())
    };
    let set_operation = select
        .get("op")
        .and_then(Value::as_i64)
        .is_some_and(|op| op > pg_query::protobuf::SetOperation::SetopNone as i64);
    u64::from(set("distinct_clause")) + u64::from(set("group_clause")) + u64::from(set_operation)
}

/// Regression (the nineteenth adversarial read, issue 23): PostgreSQL copies
/// a `NOT MATERIALIZED` CTE's query into every reference, the later CTEs'
/// bodies included, so each CTE reading the one before twice doubles the
/// plan (2^n copies, gigabytes while planning), and a sort in it is made once
/// per reference. A CTE read more than once is otherwise materialized once.
fn check_materialized(cte: &Value) -> Result<(), Refusal> {
    let never = pg_query::protobuf::CteMaterialize::Never as i64;
    if cte.get("ctematerialized").and_then(Value::as_i64) == Some(never) {
        return Err(forbidden(
            "NOT MATERIALIZED is not allowed: PostgreSQL copies such a CTE into every place that reads \
             it, so CTEs that read each other multiply the plan; leave it out (PostgreSQL inlines a CTE \
             read once by itself)",
        ));
    }
    Ok(())
}

/// Regression (the nineteenth adversarial read and its review, issue 23): a
/// bare `*` is every column of every relation in FROM, one row: over 1,000
/// joined copies of a table of 1 MB rows, one 1 GB row, which the host reads
/// whole before it can weigh it. A row holds at most [`VALUE_ROWS`] values
/// of `max_row_bytes`; a table's or view's row counts [`VIEW_ROWS`] of them,
/// a CTE's, subquery's or function's [`VALUE_ROWS`] (its values are computed).
fn check_star(select: &Value, ctes: &[String]) -> Result<(), Refusal> {
    let from: Vec<&Value> = list(select, "from_clause").collect();
    star_within(list(select, "target_list"), from, 0, ctes)
}

/// `RETURNING *` of an UPDATE ... FROM, a DELETE ... USING or an INSERT:
/// its table's row and those of the others.
fn check_returning_star(statement: &Value, ctes: &[String]) -> Result<(), Refusal> {
    let from: Vec<&Value> = ["from_clause", "using_clause"]
        .iter()
        .flat_map(|k| list(statement, k))
        .collect();
    let returning = statement
        .pointer("/returning_clause/exprs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    star_within(returning, from, VIEW_ROWS, ctes)
}

fn star_within<'a>(
    targets: impl Iterator<Item = &'a Value>,
    from: Vec<&'a Value>,
    base: u64,
    ctes: &[String],
) -> Result<(), Refusal> {
    // Each FROM item (a join with an alias too) by the name a star may
    // qualify, with the values its row holds.
    let mut items: Vec<(String, u64)> = Vec::new();
    let all = from
        .iter()
        .map(|item| item_values(item, ctes, &mut items))
        .sum::<u64>();
    let mut values = 0u64;
    for target in targets {
        let fields = target
            .pointer("/node/ResTarget/val/node/ColumnRef/fields")
            .and_then(Value::as_array);
        let fields: &[Value] = fields.map_or(&[], Vec::as_slice);
        if fields.last().and_then(|f| f.pointer("/node/AStar")).is_none() {
            continue;
        }
        values = values.saturating_add(match fields {
            [_star] => base.saturating_add(all),
            [qualifier, _star] => {
                let name = qualifier
                    .pointer("/node/String/sval")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                // The statement's own table (RETURNING t.*) or an unknown
                // name: at most everything.
                items
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map_or(base.saturating_add(all), |(_, v)| *v)
            }
            _ => base.saturating_add(all),
        });
    }
    if values > VALUE_ROWS {
        return Err(Refusal::Limit(format!(
            "* here is one row of up to {values} values of limits.max_row_bytes (every column of every \
             relation it covers: {VIEW_ROWS} per table or view, {VALUE_ROWS} per CTE, subquery or \
             function); at most {VALUE_ROWS}: name the columns"
        )));
    }
    Ok(())
}

/// The values one FROM item's row holds; records it (and the items inside a
/// join) under the names a star may qualify.
fn item_values(item: &Value, ctes: &[String], items: &mut Vec<(String, u64)>) -> u64 {
    let node = item.get("node");
    let alias = |n: &Value| {
        n.pointer("/alias/aliasname")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    if let Some(join) = node.and_then(|n| n.get("JoinExpr")) {
        let values = ["larg", "rarg"]
            .iter()
            .filter_map(|k| join.get(*k))
            .map(|side| item_values(side, ctes, items))
            .sum();
        if let Some(name) = alias(join) {
            items.push((name, values));
        }
        return values;
    }
    if let Some(relation) = node.and_then(|n| n.get("RangeVar")) {
        let values = if is_cte(relation, ctes) {
            VALUE_ROWS
        } else {
            VIEW_ROWS
        };
        let name =
            alias(relation).or_else(|| relation.get("relname").and_then(Value::as_str).map(str::to_owned));
        items.extend(name.map(|n| (n, values)));
        return values;
    }
    let inner = node.and_then(|n| n.as_object()).and_then(|o| o.values().next());
    items.extend(inner.and_then(alias).map(|n| (n, VALUE_ROWS)));
    VALUE_ROWS
}
