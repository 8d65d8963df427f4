//! Reading PostgreSQL's parse tree (as JSON) for the work bound: nodes,
//! names, the tables a statement writes, what a bare name may stand for.

use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// Whether a table, CTE or join is given column names where it is read.
pub(super) fn renamed_on_reading(tree: &Value) -> bool {
    let mut stack = vec![tree];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                let renames = |n: &Map<String, Value>| {
                    n.get("alias")
                        .and_then(|a| a.get("colnames"))
                        .and_then(Value::as_array)
                        .is_some_and(|c| !c.is_empty())
                };
                let joined = matches!(node(fields), Some(("JoinExpr", n)) if renames(n));
                if joined || (fields.contains_key("relname") && renames(fields)) {
                    return true;
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    false
}

/// Whether a CTE of the statement reads itself.
pub(super) fn has_recursion(tree: &Value) -> bool {
    let mut stack = vec![tree];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(("CommonTableExpr", n)) = node(fields)
                    && let Some(name) = n.get("ctename").and_then(Value::as_str)
                    && reads_table(n.get("ctequery"), name)
                {
                    return true;
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    false
}

pub(super) fn count_queries(value: &Value) -> u64 {
    let mut stack = vec![value];
    let mut n = 0;
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                // A data-modifying CTE's RETURNING is a query's output too
                // (the seventeenth adversarial read: a chain of DELETE ...
                // RETURNING counted as none, so too few rounds carried it).
                let query = [
                    "target_list",
                    "values_lists",
                    "returning_clause",
                    "returning_list",
                ]
                .iter()
                .any(|key| fields.contains_key(*key));
                n += u64::from(query);
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    n
}

/// True for a node that makes an array: `ARRAY[...]`, `ARRAY(...)` or a cast to an array type.
pub fn is_array(kind: &str, n: &Map<String, Value>) -> bool {
    match kind {
        "AArrayExpr" => true,
        "SubLink" => n.get("sub_link_type").and_then(Value::as_i64) == Some(7),
        "TypeCast" => n
            .get("type_name")
            .and_then(|t| t.get("array_bounds"))
            .and_then(Value::as_array)
            .is_some_and(|b| !b.is_empty()),
        _ => false,
    }
}

/// `{"node": {Kind: {...}}}` as (Kind, fields).
pub(super) fn node(fields: &Map<String, Value>) -> Option<(&str, &Map<String, Value>)> {
    if fields.len() != 1 {
        return None;
    }
    let (kind, inner) = fields.get("node")?.as_object()?.iter().next()?;
    Some((kind.as_str(), inner.as_object()?))
}

/// A UNION (or other set operation) of the queries in its `larg`, `rarg`.
pub(super) fn is_set_operation(query: &Map<String, Value>) -> bool {
    let op = query.get("op").and_then(Value::as_i64).unwrap_or_default();
    op > pg_query::protobuf::SetOperation::SetopNone as i64
}

/// `q.name` of a column reference of two names.
pub(super) fn qualified_name(list: Option<&Value>) -> Option<String> {
    fn sval(f: &Value) -> Option<&str> {
        f.pointer("/node/String/sval").and_then(Value::as_str)
    }
    match list?.as_array()?.as_slice() {
        [qualifier, name] => Some(format!("{}.{}", sval(qualifier)?, sval(name)?)),
        _ => None,
    }
}

pub(super) fn first_name(list: Option<&Value>) -> Option<&str> {
    list?.as_array()?.first()?.pointer("/node/String/sval")?.as_str()
}

pub(super) fn last_name(list: Option<&Value>) -> Option<&str> {
    list?
        .as_array()?
        .last()?
        .get("node")?
        .get("String")?
        .get("sval")?
        .as_str()
}

/// The tables the statement inserts into or updates (anywhere, CTEs too),
/// once per time a row of theirs runs their own expressions.
pub fn written_tables(tree: &Value) -> Vec<&str> {
    let mut stack = vec![tree];
    let mut written = Vec::new();
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(("InsertStmt" | "UpdateStmt", stmt)) = node(fields)
                    && let Some(name) = stmt
                        .get("relation")
                        .and_then(|r| r.get("relname"))
                        .and_then(Value::as_str)
                {
                    written.push(name);
                    // ON CONFLICT DO UPDATE runs the table's expressions on the
                    // insert attempt and again on the update.
                    let update = stmt
                        .get("on_conflict_clause")
                        .and_then(|c| c.get("action"))
                        .and_then(Value::as_i64)
                        .is_some_and(|a| a == pg_query::protobuf::OnConflictAction::OnconflictUpdate as i64);
                    if update {
                        written.push(name);
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    written
}

/// A SELECT or RETURNING item that is `*` or `x.*`.
pub(super) fn star_target(target: &Value) -> bool {
    let fields = target
        .pointer("/node/ResTarget/val/node/ColumnRef/fields")
        .and_then(Value::as_array);
    fields
        .and_then(|f| f.last())
        .is_some_and(|last| last.pointer("/node/AStar").is_some())
}

/// The names a bare column reference could take for a whole row: derived
/// tables and CTEs (refused there), and tables, views and their aliases
/// (counted as a row of [`VIEW_ROWS`]).
///
/// Regression (the forty-fourth adversarial read, issue 23): a whole row
/// that is not a table's is a value of an anonymous record type, which a
/// PostgreSQL session registers for good (16 KB for 64 columns, a new one
/// for each list of column names). So a function in FROM counts as derived
/// unless its alias names one plain value (one call of `unnest` with one
/// argument, or of `generate_series`, without column names or ORDINALITY),
/// and so does a CTE read under an alias (`FROM w AS x`).
pub(super) fn names(tree: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut stack = vec![tree];
    let (mut derived, mut relations) = (BTreeSet::new(), BTreeSet::new());
    let ctes = cte_names(tree);
    let alias = |n: &Map<String, Value>| {
        n.get("alias")
            .and_then(|a| a.get("aliasname"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                match node(fields) {
                    // A function in FROM: its alias names its value
                    // (`unnest($1) AS u`) if it is one plain value, else a row.
                    Some(("RangeFunction", n)) => {
                        if !one_value(n) {
                            derived.extend(alias(n));
                        }
                        stack.extend(n.get("functions"));
                        continue;
                    }
                    Some(("RangeSubselect" | "JoinExpr", n)) => derived.extend(alias(n)),
                    Some(("CommonTableExpr", n)) => {
                        derived.extend(n.get("ctename").and_then(Value::as_str).map(str::to_owned))
                    }
                    _ => {}
                }
                // A RangeVar, wrapped in a node or not (an INSERT's or UPDATE's own relation is not).
                if let Some(name) = fields.get("relname").and_then(Value::as_str) {
                    if ctes.contains(name) {
                        derived.extend(alias(fields));
                    } else {
                        relations.insert(name.to_owned());
                        relations.extend(alias(fields));
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    (derived, relations)
}

/// Every CTE name a statement defines.
fn cte_names(tree: &Value) -> BTreeSet<String> {
    crate::sandbox::postgres::nodes::nodes(tree)
        .filter(|(kind, _)| *kind == "CommonTableExpr")
        .filter_map(|(_, n)| n.get("ctename").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// A function in FROM whose alias names one plain value: one call, of
/// `unnest` with one argument or of `generate_series`, with no column names
/// and no ORDINALITY.
fn one_value(range: &Map<String, Value>) -> bool {
    let calls = range.get("functions").and_then(Value::as_array);
    let [call] = calls.map(Vec::as_slice).unwrap_or_default() else {
        return false;
    };
    let first = call
        .pointer("/node/List/items")
        .and_then(Value::as_array)
        .and_then(|items| items.first());
    let Some(function) = first.and_then(|f| f.pointer("/node/FuncCall")) else {
        return false;
    };
    let name = function
        .get("funcname")
        .and_then(Value::as_array)
        .and_then(|parts| parts.last())
        .and_then(|part| part.pointer("/node/String/sval"))
        .and_then(Value::as_str);
    let arguments = function.get("args").and_then(Value::as_array).map_or(0, Vec::len);
    let named_columns = range
        .get("alias")
        .and_then(|a| a.get("colnames"))
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty());
    let ordinality = range.get("ordinality").and_then(Value::as_bool) == Some(true);
    let rows_from = range.get("is_rowsfrom").and_then(Value::as_bool) == Some(true);
    !named_columns
        && !ordinality
        && !rows_from
        && match name {
            Some("unnest") => arguments == 1,
            Some("generate_series") => true,
            _ => false,
        }
}

/// The aliases of joins, tables, views, CTE references and functions in
/// FROM: a column qualified by one of them may be anything its relation
/// passes on, not the output of a subquery or CTE of that name.
pub(super) fn aliases(tree: &Value) -> BTreeSet<String> {
    let mut stack = vec![tree];
    let mut aliases = BTreeSet::new();
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                let aliased = match node(fields) {
                    Some(("JoinExpr" | "RangeFunction" | "RangeTableFunc", n)) => Some(n),
                    // A RangeVar, wrapped in a node or not.
                    _ if fields.contains_key("relname") => Some(fields),
                    _ => None,
                };
                let alias = aliased.and_then(|n| n.get("alias")?.get("aliasname")?.as_str());
                aliases.extend(alias.map(str::to_owned));
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    aliases
}

/// The names in FROM (a RangeVar's own name or alias) that stand only for
/// tables or views: not a CTE's name anywhere in the statement (a RangeVar
/// may read a CTE), nor the name of any subquery, CTE, join or function.
pub(super) fn tables(tree: &Value) -> BTreeSet<String> {
    let (mut excluded, _) = names(tree);
    let alias = |n: &Map<String, Value>| n.get("alias")?.get("aliasname")?.as_str().map(str::to_owned);
    let mut stack = vec![tree];
    let mut candidates = BTreeSet::new();
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(("JoinExpr" | "RangeFunction" | "RangeTableFunc", n)) = node(fields) {
                    excluded.extend(alias(n));
                }
                // A RangeVar, wrapped in a node or not.
                if let Some(name) = fields.get("relname").and_then(Value::as_str) {
                    candidates.insert((name.to_owned(), alias(fields)));
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    // A reader of a CTE (or of a table named like one): its alias is a
    // derived relation's too.
    let (ctes, tables): (Vec<_>, Vec<_>) = candidates
        .into_iter()
        .partition(|(name, _)| excluded.contains(name));
    excluded.extend(ctes.into_iter().filter_map(|(_, alias)| alias));
    tables
        .into_iter()
        .map(|(name, alias)| alias.unwrap_or(name))
        .filter(|name| !excluded.contains(name))
        .collect()
}

/// The name a SELECT item's column gets: its alias, a column's own name,
/// or a function's.
pub(super) fn target_name(target: &Value) -> Option<&str> {
    let t = target.pointer("/node/ResTarget")?;
    match t.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => Some(name),
        _ => {
            let val = t.pointer("/val/node")?;
            last_name(val.pointer("/ColumnRef/fields"))
                .or_else(|| last_name(val.pointer("/FuncCall/funcname")))
        }
    }
}

/// The String nodes of a list, in order.
pub(super) fn strings_of(list: Option<&Value>) -> Vec<&str> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| item.pointer("/node/String/sval").and_then(Value::as_str))
        .collect()
}

pub(super) fn fields_len(n: &Map<String, Value>) -> usize {
    n.get("fields").and_then(Value::as_array).map_or(0, Vec::len)
}

/// Whether the query `value` names the table `name` (a CTE that reads itself).
pub fn reads_table(value: Option<&Value>, name: &str) -> bool {
    let mut stack: Vec<&Value> = value.into_iter().collect();
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                // A schema-qualified name is never a CTE (the review of the
                // twenty-first read: `WITH RECURSIVE u AS (... FROM h.u)`
                // read as recursive, so never copied).
                if let Some(("RangeVar", range)) = node(fields)
                    && range.get("relname").and_then(Value::as_str) == Some(name)
                    && range
                        .get("schemaname")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .is_empty()
                {
                    return true;
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    false
}

/// True for an expression of literals alone (no parameter, column or
/// subquery), which the planner evaluates once while planning.
pub(super) fn is_constant(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.iter().all(is_constant),
        Value::Object(fields) => fields
            .iter()
            .all(|(key, v)| !matches!(key.as_str(), "ParamRef" | "ColumnRef" | "SubLink") && is_constant(v)),
        _ => true,
    }
}
