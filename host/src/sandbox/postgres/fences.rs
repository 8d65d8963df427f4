//! No computed column crosses a query level unfenced (issue 23).
//!
//! PostgreSQL's planner merges a subquery in FROM, and a CTE it inlines,
//! into the query that reads it, and then copies each derived column's
//! expression into every place that names it: every reference, every join
//! clause an equivalence class or `USING` makes, every filter it pushes
//! down. Copies of copies multiply level by level (ten references per level
//! over eight levels held more than 6 GB while planning, where no deadline
//! is looked at; the nineteenth to twenty-first adversarial reads found one
//! path after another: references, UNION arms, VALUES columns, equivalence
//! classes, `USING`). Counting each path one by one (`sandbox::work`) trails
//! the planner; this rule closes the class.
//!
//! A subquery in FROM, a one-row VALUES in FROM and a CTE whose output list
//! computes anything must be *fenced*: a subquery or CTE body with `OFFSET`
//! or `LIMIT` is never merged (PostgreSQL's documented optimization fence:
//! it plans such a query on its own, pushes no filter into it, and its
//! readers see its columns as values), and a CTE written `AS MATERIALIZED`
//! is stored. Unfenced ones may output only what copies cheaply: columns,
//! `*`, parameters and short literals (and casts of those two). A CTE that
//! reads itself (`WITH RECURSIVE`) is always stored, and a data-modifying one
//! always materialized, so neither needs a fence.
//!
//! The work model still counts copies wherever they could happen; this rule
//! makes the paths it does not know of unreachable.

use crate::sandbox::guard::{Refusal, forbidden};
use serde_json::Value;

/// A literal copied per reference may be this long (a copy of it is a node
/// and its bytes).
const SHORT_LITERAL_BYTES: usize = 64;

/// Checks a subquery in FROM (the body of a `RangeSubselect`).
pub(super) fn check_subselect(node: &Value) -> Result<(), Refusal> {
    let Some(select) = node.pointer("/subquery/node/SelectStmt") else {
        return Ok(());
    };
    if fenced(select) || copies_cheaply(select) {
        return Ok(());
    }
    let name = node
        .pointer("/alias/aliasname")
        .and_then(Value::as_str)
        .map_or_else(
            || "a subquery in FROM".to_owned(),
            |a| format!("the subquery {a}"),
        );
    Err(forbidden(format!(
        "{name} computes columns (calls, operators or long literals in its SELECT list) and has no OFFSET \
         or LIMIT: PostgreSQL would merge it into its reader and copy each computed column into every \
         place that reads it, while planning, where no deadline is looked at; end it with OFFSET 0 (which \
         keeps it a query of its own and changes no result), or compute the columns in the outer query"
    )))
}

/// Checks the CTEs of a `WITH` (a `WithClause`'s fields).
pub(super) fn check_with(with: &Value) -> Result<(), Refusal> {
    let recursive = with.get("recursive").and_then(Value::as_bool) == Some(true);
    let ctes = with.get("ctes").and_then(Value::as_array).into_iter().flatten();
    for cte in ctes {
        let Some(cte) = cte.pointer("/node/CommonTableExpr") else {
            continue;
        };
        // INSERT, UPDATE and DELETE bodies are always materialized.
        let Some(body) = cte.pointer("/ctequery/node/SelectStmt") else {
            continue;
        };
        let name = cte.get("ctename").and_then(Value::as_str).unwrap_or_default();
        let always = pg_query::protobuf::CteMaterialize::Always as i64;
        let materialized = cte.get("ctematerialized").and_then(Value::as_i64) == Some(always);
        let reads_itself = recursive && crate::sandbox::work::reads_table(cte.get("ctequery"), name);
        if materialized || reads_itself || fenced(body) || copies_cheaply(body) {
            continue;
        }
        return Err(forbidden(format!(
            "the CTE {name} computes columns (calls, operators or long literals in its SELECT list) and is \
             not written AS MATERIALIZED: PostgreSQL would merge it into its reader and copy each computed \
             column into every place that reads it, while planning, where no deadline is looked at; write \
             {name} AS MATERIALIZED (...), or compute the columns in the query that reads it"
        )));
    }
    Ok(())
}

/// `query` (a `Node`) is a SELECT that PostgreSQL plans on its own, whose
/// readers read its columns as values (see [`fenced`]).
pub(crate) fn fenced_query(query: Option<&Value>) -> bool {
    query
        .and_then(|q| q.pointer("/node/SelectStmt"))
        .is_some_and(fenced)
}

/// A query PostgreSQL never merges into its reader: it has an `OFFSET`, or
/// a `LIMIT` other than `LIMIT ALL` (which the planner may drop).
fn fenced(select: &Value) -> bool {
    let present = |field: &str| {
        select
            .get(field)
            .and_then(|n| n.get("node"))
            .is_some_and(|n| !n.is_null() && !is_null_constant(n))
    };
    present("limit_offset") || present("limit_count")
}

fn is_null_constant(node: &Value) -> bool {
    node.get("AConst")
        .and_then(|c| c.get("isnull"))
        .and_then(Value::as_bool)
        == Some(true)
}

/// Every output of the query (of every arm of a set operation that is not
/// fenced itself, of a one-row VALUES) is cheap to copy. A VALUES of more
/// rows is scanned, never merged.
fn copies_cheaply(select: &Value) -> bool {
    let arm = |side: &str| select.get(side).filter(|arm| !arm.is_null());
    if let (Some(larg), Some(rarg)) = (arm("larg"), arm("rarg")) {
        return [larg, rarg].into_iter().all(|arm| {
            let arm = arm.get("SelectStmt").unwrap_or(arm);
            fenced(arm) || copies_cheaply(arm)
        });
    }
    let rows = select.get("values_lists").and_then(Value::as_array);
    if let Some(rows) = rows.filter(|rows| !rows.is_empty()) {
        return match rows.as_slice() {
            [one] => {
                let items = one.pointer("/node/List/items").and_then(Value::as_array);
                items.into_iter().flatten().all(cheap)
            }
            _ => true,
        };
    }
    let targets = select.get("target_list").and_then(Value::as_array);
    targets
        .into_iter()
        .flatten()
        .all(|target| target.pointer("/node/ResTarget/val").is_none_or(cheap))
}

/// A column, `*`, a parameter, a short literal, or a cast of the last two.
fn cheap(item: &Value) -> bool {
    let Some((kind, node)) = item
        .get("node")
        .and_then(Value::as_object)
        .and_then(|n| n.iter().next())
    else {
        return false;
    };
    match kind.as_str() {
        "ColumnRef" | "ParamRef" => true,
        "AConst" => short_literal(node),
        "TypeCast" => match node
            .pointer("/arg/node")
            .and_then(Value::as_object)
            .and_then(|n| n.iter().next())
        {
            Some((arg, inner)) => arg == "ParamRef" || arg == "AConst" && short_literal(inner),
            None => false,
        },
        _ => false,
    }
}

/// A NULL, an integer or a boolean, or a number, string or bit string of at
/// most [`SHORT_LITERAL_BYTES`] characters; nothing else.
fn short_literal(node: &Value) -> bool {
    if node.get("isnull").and_then(Value::as_bool) == Some(true) {
        return true;
    }
    let Some((kind, value)) = node
        .get("val")
        .and_then(Value::as_object)
        .and_then(|v| v.iter().next())
    else {
        return false;
    };
    match kind.as_str() {
        "Ival" | "Boolval" => true,
        "Sval" | "Fval" | "Bsval" => value
            .as_object()
            .and_then(|v| v.values().next())
            .and_then(Value::as_str)
            .is_some_and(|text| text.len() <= SHORT_LITERAL_BYTES),
        _ => false,
    }
}
