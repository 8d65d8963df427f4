//! What PostgreSQL 15 keeps in memory whatever `work_mem` says (the
//! seventeenth and eighteenth adversarial reads, issue 23): some hash tables,
//! and the rows a top-N sort holds (`sorted_limits`). The syntax that makes them is refused,
//! or bounded, since nothing else a statement does can bound them. (A hash
//! join that cannot split its batches is the other such case; handler
//! sessions run with `enable_hashjoin = off`, see `db::logins`.)

use crate::sandbox::guard::{Refusal, forbidden};
use crate::sandbox::work::{COLUMN_DIGITS, VIEW_ROWS};
use pg_query::protobuf::SetOperation;
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

pub(super) fn set_operation(node: &Value) -> Option<pg_query::protobuf::SetOperation> {
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

/// The names a query's FROM items go by (aliases, else relation names).
pub(super) fn relation_names(select: &Value) -> Vec<String> {
    let mut names = Vec::new();
    let mut from: Vec<&Value> = list(select, "from_clause").collect();
    while let Some(item) = from.pop() {
        let Some(node) = item.get("node") else { continue };
        if let Some(relation) = node.get("RangeVar") {
            let alias = relation.pointer("/alias/aliasname").and_then(Value::as_str);
            let name = alias.or_else(|| relation.get("relname").and_then(Value::as_str));
            names.extend(name.map(str::to_owned));
        } else if let Some(join) = node.get("JoinExpr") {
            from.extend(["larg", "rarg"].iter().filter_map(|k| join.get(*k)));
        }
    }
    names
}

/// A call's function name, without its schema.
pub(super) fn call_name(call: &Value) -> &str {
    call.get("funcname")
        .and_then(Value::as_array)
        .and_then(|parts| parts.last())
        .and_then(|part| part.pointer("/node/String/sval"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

pub(super) fn list<'a>(node: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    node.get(key).and_then(Value::as_array).into_iter().flatten()
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

/// Regression (the second review of the eighteenth adversarial read, issue
/// 23): a hash aggregate checks its memory only when it makes a new group,
/// so `max()` or `min()` of text, growing within groups already made, held
/// 512 MB in one backend; and `enable_hashagg = off` only makes hashing look
/// dearer to the planner, which a large enough estimate outweighs.
pub(super) fn check_grouped_extremes(select: &Value) -> Result<(), Refusal> {
    if list(select, "group_clause").next().is_none() {
        return Ok(());
    }
    // Wherever an aggregate of this query may stand: its SELECT list,
    // HAVING, ORDER BY, DISTINCT ON, windows, and subqueries there (an
    // aggregate of outer columns in a subquery is the outer query's).
    let own_rows = [
        "from_clause",
        "with_clause",
        "where_clause",
        "group_clause",
        "larg",
        "rarg",
    ];
    let mut stack: Vec<&Value> = select
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !own_rows.contains(&k.as_str()))
        .map(|(_, v)| v)
        .collect();
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(call) = fields.get("FuncCall") {
                    let name = call_name(call);
                    let windowed = call.get("over").is_some_and(|o| !o.is_null());
                    if matches!(name.to_ascii_lowercase().as_str(), "max" | "min") && !windowed {
                        return Err(forbidden(
                            "max() and min() are not allowed with GROUP BY: PostgreSQL may hash the \
                             groups and lets a group's value grow past work_mem unchecked; use \
                             DISTINCT ON (...) ... ORDER BY, or a subquery with ORDER BY ... LIMIT 1",
                        ));
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    Ok(())
}

/// Regression (the second review of the eighteenth adversarial read, issue
/// 23): statements count a view's row as [`VIEW_ROWS`] stored rows, but a
/// view that selected sixty copies of a 200 KB literal from a subquery made
/// rows of 12 MB, and a sort under a LIMIT of them held 375 MB. So a view
/// selects columns (and `*`) of tables and views, joined, and nothing else.
pub(super) fn check_view_rows(tree: &Value) -> Result<(), Refusal> {
    let refused = || {
        forbidden(
            "a view on PostgreSQL selects only columns of tables and views (joined if need be): no \
             literals, parameters, subqueries, table functions, VALUES or UNION, whose values would \
             count as stored rows in the statements that read the view",
        )
    };
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                let select = fields.get("SelectStmt").or_else(|| {
                    // A set operation's branches are bare SelectStmts.
                    fields.get("target_list").map(|_| value)
                });
                if let Some(select) = select {
                    let columns = list(select, "target_list").all(|t| {
                        t.pointer("/node/ResTarget/val/node")
                            .and_then(Value::as_object)
                            .is_some_and(|n| n.contains_key("ColumnRef"))
                    });
                    let mut from: Vec<&Value> = list(select, "from_clause").collect();
                    let mut plain = true;
                    while let Some(item) = from.pop() {
                        match item.get("node") {
                            Some(n) if n.get("RangeVar").is_some() => {}
                            Some(n) if n.get("JoinExpr").is_some() => {
                                let join = &n["JoinExpr"];
                                from.extend(["larg", "rarg"].iter().filter_map(|k| join.get(*k)));
                            }
                            _ => plain = false,
                        }
                    }
                    let values = select
                        .get("values_lists")
                        .and_then(Value::as_array)
                        .is_some_and(|v| !v.is_empty());
                    // A UNION view: PostgreSQL may sort each branch under a
                    // reader's LIMIT, one bounded sort per branch.
                    let set = set_operation(select).is_some_and(|op| op != SetOperation::SetopNone);
                    if !columns || !plain || values || set {
                        return Err(refused());
                    }
                    // Regression (the nineteenth adversarial read): a view
                    // is copied into every statement that reads it, once
                    // per reference, so a sort in it (bounded once, when the
                    // view was made) is made once per reference.
                    let clause = |k: &str| {
                        select.get(k).is_some_and(|v| match v {
                            Value::Array(items) => !items.is_empty(),
                            other => !other.is_null(),
                        })
                    };
                    const SHAPING: &[&str] = &[
                        "sort_clause",
                        "limit_count",
                        "limit_offset",
                        "distinct_clause",
                        "group_clause",
                        "having_clause",
                        "window_clause",
                    ];
                    let shaped = SHAPING.iter().find(|k| clause(k));
                    if let Some(clause) = shaped {
                        return Err(forbidden(format!(
                            "a view on PostgreSQL may not sort, group, limit or window its rows ({clause} \
                             found): each statement that reads it gets its own copy of that work; do it in \
                             the statement"
                        )));
                    }
                    // Its readers count its row as VIEW_ROWS stored rows.
                    if relation_names(select).len() as u64 > VIEW_ROWS {
                        return Err(forbidden(format!(
                            "a view on PostgreSQL joins at most {VIEW_ROWS} tables or views: the statements \
                             that read it count its row as that many stored rows"
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

/// The most digits a numeric literal may have: as many as a numeric column
/// (`sandbox::work`'s bound). Regression (the third review of the
/// eighteenth adversarial read, issue 23): `sum(1e131071)` per group grew
/// each group's state to 262 KB after the group was made, where a hash
/// aggregate never looks.
pub(super) fn check_numeric_literal(node: &Value) -> Result<(), Refusal> {
    let Some(text) = node.pointer("/val/Fval/fval").and_then(Value::as_str) else {
        return Ok(());
    };
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].trim().parse::<i64>().ok()),
        None => (text, Some(0)),
    };
    let digits = mantissa.bytes().filter(u8::is_ascii_digit).count() as u64;
    let digits = exponent.map_or(u64::MAX, |e| digits.saturating_add(e.unsigned_abs()));
    if digits > COLUMN_DIGITS {
        let shown: String = text.chars().take(40).collect();
        return Err(forbidden(format!(
            "the number {shown} has more than {COLUMN_DIGITS} digits: write it with fewer (a numeric \
             column holds at most as many)"
        )));
    }
    Ok(())
}

/// Regression (the third review of the eighteenth adversarial read, issue
/// 23): PostgreSQL turns an `EXISTS` in WHERE or ON, among ANDs (or under one
/// NOT), into a semi- or anti-join, which spills. Anywhere else (under OR,
/// in CASE, in a SELECT list) it stays a subplan, which PostgreSQL may turn
/// into a hashed `= ANY`: the in-memory hash table `x IN (SELECT ...)` is
/// refused for.
pub(super) fn check_exists_placement(tree: &Value) -> Result<(), Refusal> {
    use pg_query::protobuf::SubLinkType;
    // Regression (the nineteenth adversarial read): PostgreSQL never makes
    // an EXISTS whose subquery has a WITH of its own a join.
    let with = |n: &Value| {
        n.pointer("/subselect/node/SelectStmt/with_clause")
            .is_some_and(|w| !w.is_null())
    };
    let exists = |n: &Value| {
        n.get("sub_link_type").and_then(Value::as_i64) == Some(SubLinkType::ExistsSublink as i64) && !with(n)
    };
    // The EXISTS that join: found from every WHERE and every inner join's
    // ON, through AND and NOT. Regression (the nineteenth adversarial read):
    // in an outer join's ON, PostgreSQL joins an EXISTS only if it reads the
    // nullable side alone, else it stays a subplan (hashed: 1.8 GB); so only
    // an inner join's ON counts.
    let mut joined: std::collections::HashSet<*const Value> = std::collections::HashSet::new();
    let mut roots: Vec<&Value> = Vec::new();
    let inner = pg_query::protobuf::JoinType::JoinInner as i64;
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                // Regression (the review of the nineteenth read): ON CONFLICT
                // DO UPDATE's WHERE is never pulled up into a join, and with
                // RETURNING its subplan is hashed (1.9 GB).
                let on_conflict = fields.contains_key("infer") && fields.contains_key("action");
                if !on_conflict {
                    roots.extend(fields.get("where_clause"));
                }
                if fields.get("jointype").and_then(Value::as_i64) == Some(inner) {
                    roots.extend(fields.get("quals"));
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    while let Some(condition) = roots.pop() {
        let Some(node) = condition.get("node") else {
            continue;
        };
        if let Some(sublink) = node.get("SubLink") {
            if exists(sublink) {
                joined.insert(sublink as *const Value);
            }
        } else if let Some(bool_expr) = node.get("BoolExpr") {
            use pg_query::protobuf::BoolExprType;
            let op = bool_expr
                .get("boolop")
                .and_then(Value::as_i64)
                .unwrap_or_default();
            let args = list(bool_expr, "args");
            if op == BoolExprType::AndExpr as i64 {
                roots.extend(args);
            } else if op == BoolExprType::NotExpr as i64 {
                // NOT EXISTS is an anti-join; NOT over more is not a join.
                for arg in args {
                    if let Some(sublink) = arg.pointer("/node/SubLink").filter(|s| exists(s)) {
                        joined.insert(sublink as *const Value);
                    }
                }
            }
        }
    }
    let mut stack = vec![tree];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                if let Some(sublink) = fields.get("SubLink")
                    && sublink.get("sub_link_type").and_then(Value::as_i64)
                        == Some(SubLinkType::ExistsSublink as i64)
                {
                    if with(sublink) {
                        return Err(forbidden(
                            "EXISTS (WITH ...) is not allowed: PostgreSQL never makes it a join and may \
                             hash its subquery in memory with no bound; move the CTE to the statement's WITH",
                        ));
                    }
                    if !joined.contains(&(sublink as *const Value)) {
                        return Err(forbidden(
                            "EXISTS is allowed only as a condition of WHERE or of an inner join's ON, joined \
                             with AND (or NOT EXISTS): anywhere else (under OR, in CASE, in a SELECT list, \
                             in a LEFT or RIGHT JOIN's ON) PostgreSQL may hash its subquery in memory with \
                             no bound; split the condition, move it to WHERE, or UNION ALL two queries",
                        ));
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    Ok(())
}
