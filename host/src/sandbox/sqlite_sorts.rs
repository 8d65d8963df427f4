//! How many keys one sort of a handler's statement may compare on SQLite.
//!
//! Regression (the twenty-second adversarial read, issue 23): SQLite sorts
//! each run of its sorter (up to the connection's cache size, see
//! `super::sqlite_memory`) in one VM step, where the deadline is never
//! looked at, and a comparison whose first key ties goes on to the next:
//! `ORDER BY y, y, ... (62 times), x` over 3M rows ran 2 s (the bundled
//! SQLite; 6 s on Debian's 3.40) in that step. With one key SQLite compares
//! integers and text by a fast path; each further key adds the full record
//! comparison. Measured on the bundled SQLite (3M rows tied on all but the
//! last key; a progress handler every 1,000 instructions, the longest gap
//! between two calls): 63 keys in 64 MiB runs 2.2 s in one step, 8 keys
//! 0.80 s; in 32 MiB runs 8 integer keys 0.40 s, 8 empty texts 0.92 s; in
//! runs of `sqlite_memory::CACHE_KIB` 8 empty texts 0.42 s, empty
//! blobs 0.32 s, integers 0.19 s.

use super::guard::Refusal;
use sqlparser::ast::{Expr, FunctionArguments, SetExpr, Statement, Visit, Visitor};
use std::ops::ControlFlow;

/// The most keys one sort may compare: an ORDER BY, a GROUP BY, a window's
/// PARTITION BY and ORDER BY together, an aggregate's ORDER BY, an index
/// (see above).
pub const MAX_SORT_KEYS: usize = 8;

/// Refuses a statement with a sort of more than [`MAX_SORT_KEYS`] keys.
pub fn check(statement: &Statement) -> Result<(), Refusal> {
    let mut keys = SortKeys::default();
    let _ = statement.visit(&mut keys);
    if keys.0 > MAX_SORT_KEYS {
        return Err(Refusal::Limit(format!(
            "this statement sorts by {} keys at once (an ORDER BY, a GROUP BY, a window's PARTITION BY \
             and ORDER BY together, an index; a UNION's, INTERSECT's or EXCEPT's ORDER BY sorts by \
             every result column); at most {MAX_SORT_KEYS} on SQLite, which sorts in steps its deadline \
             cannot interrupt, comparing every key of every tie",
            match keys.0 {
                usize::MAX => "all its result columns (a `*`)".to_owned(),
                n => n.to_string(),
            }
        )));
    }
    Ok(())
}

/// The most keys of any one sort in a statement (see [`MAX_SORT_KEYS`]),
/// and the keys of each named window seen (`WINDOW w AS (...)`), which a
/// window written in place may extend (`OVER (w ORDER BY ...)`).
#[derive(Default)]
struct SortKeys(usize, Vec<(String, usize)>);

impl SortKeys {
    fn sort(&mut self, keys: usize) {
        self.0 = self.0.max(keys);
    }

    /// A window's keys: its own and those of the window it names.
    fn window(&mut self, spec: &sqlparser::ast::WindowSpec) -> usize {
        let named = spec.window_name.as_ref().map_or(0, |name| self.named(name));
        let keys = (spec.partition_by.len() + spec.order_by.len()).saturating_add(named);
        self.sort(keys);
        keys
    }

    fn named(&self, name: &sqlparser::ast::Ident) -> usize {
        let name = name.value.to_ascii_lowercase();
        self.1
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, k)| *k)
            .max()
            .unwrap_or(0)
    }
}

impl Visitor for SortKeys {
    type Break = ();

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<()> {
        if let Statement::CreateIndex(index) = statement {
            self.sort(index.columns.len());
        }
        ControlFlow::Continue(())
    }

    // A compound SELECT's ORDER BY sorts by every result column, its own
    // keys first (the review of the twenty-second read: `SELECT * ... UNION
    // SELECT * ... ORDER BY 1` over 64 columns tied on 63 ran 2.5 s in one
    // step, counted as one key).
    fn pre_visit_query(&mut self, query: &sqlparser::ast::Query) -> ControlFlow<()> {
        if query.order_by.is_some() && matches!(*query.body, SetExpr::SetOperation { .. }) {
            self.sort(result_columns(&query.body));
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_order_by(&mut self, order_by: &sqlparser::ast::OrderBy) -> ControlFlow<()> {
        match &order_by.kind {
            sqlparser::ast::OrderByKind::Expressions(keys) => self.sort(keys.len()),
            // Every column of the result: refused as more than any bound.
            sqlparser::ast::OrderByKind::All(_) => self.sort(usize::MAX),
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_group_by(&mut self, group_by: &sqlparser::ast::GroupByExpr) -> ControlFlow<()> {
        match group_by {
            sqlparser::ast::GroupByExpr::Expressions(keys, _) => self.sort(keys.len()),
            sqlparser::ast::GroupByExpr::All(_) => self.sort(usize::MAX),
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, select: &sqlparser::ast::Select) -> ControlFlow<()> {
        for sqlparser::ast::NamedWindowDefinition(name, window) in &select.named_window {
            let keys = match window {
                sqlparser::ast::NamedWindowExpr::WindowSpec(spec) => self.window(spec),
                sqlparser::ast::NamedWindowExpr::NamedWindow(other) => self.named(other),
            };
            self.1.push((name.value.to_ascii_lowercase(), keys));
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        if let Expr::Function(call) = expr {
            if let Some(sqlparser::ast::WindowType::WindowSpec(spec)) = &call.over {
                self.window(spec);
            }
            self.sort(call.within_group.len());
            if let FunctionArguments::List(list) = &call.args {
                for clause in &list.clauses {
                    if let sqlparser::ast::FunctionArgumentClause::OrderBy(keys) = clause {
                        self.sort(keys.len());
                    }
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// How many columns a query's rows have, read from its first SELECT (a
/// `*` as more than any bound: the guard does not know the tables).
fn result_columns(mut body: &SetExpr) -> usize {
    loop {
        match body {
            SetExpr::SetOperation { left, .. } => body = left,
            SetExpr::Query(query) => body = &query.body,
            SetExpr::Select(select) => {
                let star = select.projection.iter().any(|item| {
                    matches!(
                        item,
                        sqlparser::ast::SelectItem::Wildcard(_)
                            | sqlparser::ast::SelectItem::QualifiedWildcard(..)
                    )
                });
                return if star { usize::MAX } else { select.projection.len() };
            }
            SetExpr::Values(values) => return values.rows.first().map_or(0, |row| row.len()),
            _ => return usize::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::SQLiteDialect;
    use sqlparser::parser::Parser;

    fn judged(sql: &str) -> Result<(), Refusal> {
        let statements = Parser::parse_sql(&SQLiteDialect {}, sql).unwrap();
        check(&statements[0])
    }

    /// Regression (the twenty-second adversarial read, issue 23): a sort's
    /// run is sorted in one step, and a tie on the first key compares the
    /// next: 63 keys over 3M rows ran 2 s in that step.
    #[test]
    fn a_sort_compares_at_most_eight_keys() {
        let keys = |n: usize| vec!["y"; n].join(", ");
        let refused = |sql: String| {
            let err = judged(&sql).unwrap_err().to_string();
            assert!(err.contains("sorts by 9 keys"), "{sql}: {err}");
        };
        refused(format!("SELECT x FROM t ORDER BY {}", keys(9)));
        refused(format!("SELECT y, count(*) FROM t GROUP BY {}", keys(9)));
        refused(format!(
            "SELECT row_number() OVER (PARTITION BY {} ORDER BY {}) FROM t",
            keys(4),
            keys(5)
        ));
        refused(format!(
            "SELECT row_number() OVER (w ORDER BY {}) FROM t WINDOW w AS (PARTITION BY {})",
            keys(4),
            keys(5)
        ));
        refused(format!("SELECT group_concat(x ORDER BY {}) FROM t", keys(9)));
        refused(format!(
            "SELECT x FROM (SELECT x FROM t ORDER BY {}) LIMIT 1",
            keys(9)
        ));
        refused(format!("CREATE INDEX i ON t ({})", keys(9)));
        refused(format!(
            "SELECT {} FROM t UNION SELECT {} FROM u ORDER BY 1",
            keys(9),
            keys(9)
        ));
        refused(format!(
            "SELECT x FROM (SELECT {} FROM t EXCEPT SELECT {} FROM u ORDER BY 1)",
            keys(9),
            keys(9)
        ));
        let err = judged("SELECT * FROM t UNION ALL SELECT * FROM u ORDER BY 1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("all its result columns"), "{err}");
        for fits in [
            format!("SELECT x FROM t ORDER BY {}", keys(8)),
            format!("SELECT y FROM t GROUP BY {} ORDER BY {}", keys(8), keys(8)),
            format!(
                "SELECT sum(x) OVER (PARTITION BY {} ORDER BY {}) FROM t",
                keys(4),
                keys(4)
            ),
            format!("CREATE INDEX i ON t ({})", keys(8)),
            format!(
                "SELECT {} FROM t UNION SELECT {} FROM u ORDER BY 1",
                keys(8),
                keys(8)
            ),
            "SELECT * FROM t UNION SELECT * FROM u".to_owned(),
        ] {
            assert!(judged(&fits).is_ok(), "{fits}");
        }
    }
}
