//! What one SQLite statement holds in memory until it ends (the
//! twenty-second adversarial read, issue 23).
//!
//! SQLite keeps every register of a statement's program until the statement
//! ends, and with the query flattener off (`authorizer::install`) each
//! subquery in FROM is a level of its own whose row is a deep copy of the
//! level below. So 64 columns naming one stored 1 MB value, under 14 levels
//! of `SELECT * FROM (...)`, three times over, held 2.7 GB: past SQLite's
//! 2 GiB heap ceiling in 2 s, in code between two of the progress handler's
//! looks, and with 6 units of the per-row work bound (`sqlite_work`), which
//! counts calls, not copies.
//!
//! Here the guard counts the values a statement's levels hold, each at most
//! `limits.max_row_bytes` (SQLite's length limit inside the walls): every
//! item of every SELECT list, VALUES row and RETURNING list; a `*` as the
//! columns of what it expands (a stored row, of a table or of a view, as one
//! value, since SQLite builds no record longer than the limit and a view
//! names each column of its table at most once; a subquery or CTE as its
//! own columns); and each table or view a level reads, as one. At most
//! [`BUDGET_BYTES`] of them, and [`MIN_VALUES`] whatever the row bound.

use super::guard::Refusal;
use sqlparser::ast::{
    Query, Select, SelectItem, SelectItemQualifiedWildcardKind, SetExpr, Statement, TableFactor,
    TableWithJoins, Visit, Visitor,
};
use std::collections::HashMap;
use std::ops::ControlFlow;

/// What a statement's values may hold together, at the row bound.
pub const BUDGET_BYTES: u64 = 512 << 20;
/// Values allowed whatever the row bound: a SELECT of 64 columns of a
/// subquery of 64 columns always fits (768 MiB at the team ceiling's 8 MiB
/// rows, within SQLite's 2 GiB heap ceiling; one handler statement runs at
/// a time on SQLite).
pub const MIN_VALUES: u64 = 96;
/// What a `*` of something unknown (a table function, a name the statement
/// does not define) counts: SQLite's column limit inside the walls.
const UNKNOWN_WIDTH: u64 = 64;

/// The most values one statement's levels may hold at this row bound.
pub fn max_values(row_bytes: usize) -> u64 {
    (BUDGET_BYTES / (row_bytes as u64).max(1)).max(MIN_VALUES)
}

/// Refuses a statement whose levels hold more than [`max_values`].
pub fn check(statement: &Statement, row_bytes: usize) -> Result<(), Refusal> {
    let mut count = Count::default();
    let _ = statement.visit(&mut count);
    let held = count.held + returning(statement, &count.ctes);
    let max = max_values(row_bytes);
    if held > max {
        return Err(Refusal::Limit(format!(
            "this statement holds up to {held} values at once: SQLite keeps every column of every level \
             of it (each SELECT list, a subquery's or a CTE's columns again wherever a * takes them, one \
             per table or view read) until the statement ends, each up to limits.max_row_bytes = \
             {row_bytes}; at most {max} fit in {} MiB: select fewer columns or nest fewer levels, or lower \
             limits.max_row_bytes",
            BUDGET_BYTES >> 20
        )));
    }
    Ok(())
}

/// The values held by every query of a statement, and each CTE's width.
#[derive(Default)]
struct Count {
    held: u64,
    /// Columns of each CTE by name (the widest, if a name is defined twice).
    ctes: HashMap<String, u64>,
}

impl Visitor for Count {
    type Break = ();

    // Pre-order: a query's CTEs are measured before any body that reads them.
    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        if let Some(with) = &query.with {
            for cte in &with.cte_tables {
                let width = output_width(&cte.query.body, &self.ctes);
                let name = cte.alias.name.value.to_ascii_lowercase();
                let entry = self.ctes.entry(name).or_default();
                *entry = (*entry).max(width);
            }
        }
        self.held = self.held.saturating_add(level(&query.body, &self.ctes));
        ControlFlow::Continue(())
    }
}

/// What the levels of one query body hold (its nested queries are visited
/// on their own).
fn level(body: &SetExpr, ctes: &HashMap<String, u64>) -> u64 {
    match body {
        SetExpr::Select(select) => {
            let reads: u64 = select.from.iter().map(relations_read).sum();
            select_width(select, ctes).saturating_add(reads)
        }
        SetExpr::SetOperation { left, right, .. } => level(left, ctes).saturating_add(level(right, ctes)),
        SetExpr::Values(values) => values_width(values),
        SetExpr::Table(_) => 2,
        SetExpr::Query(_)
        | SetExpr::Insert(_)
        | SetExpr::Update(_)
        | SetExpr::Delete(_)
        | SetExpr::Merge(_) => 0,
    }
}

/// The columns one row of `body` has.
fn output_width(body: &SetExpr, ctes: &HashMap<String, u64>) -> u64 {
    match body {
        SetExpr::Select(select) => select_width(select, ctes),
        SetExpr::SetOperation { left, right, .. } => output_width(left, ctes).max(output_width(right, ctes)),
        SetExpr::Values(values) => values_width(values),
        SetExpr::Query(query) => output_width(&query.body, ctes),
        SetExpr::Table(_) => 1,
        _ => UNKNOWN_WIDTH,
    }
}

fn values_width(values: &sqlparser::ast::Values) -> u64 {
    values.rows.iter().map(|row| row.len() as u64).max().unwrap_or(0)
}

fn select_width(select: &Select, ctes: &HashMap<String, u64>) -> u64 {
    let factors = || {
        select
            .from
            .iter()
            .flat_map(|t| std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)))
    };
    items_width(&select.projection, ctes, factors)
}

fn items_width<'a, I: Iterator<Item = &'a TableFactor>>(
    items: &[SelectItem],
    ctes: &HashMap<String, u64>,
    factors: impl Fn() -> I,
) -> u64 {
    items
        .iter()
        .map(|item| match item {
            SelectItem::Wildcard(_) => factors().map(|f| factor_width(f, ctes)).sum(),
            SelectItem::QualifiedWildcard(SelectItemQualifiedWildcardKind::ObjectName(name), _) => {
                let wanted = name.0.last().map(|p| p.to_string().to_ascii_lowercase());
                factors()
                    .find(|f| factor_name(f) == wanted)
                    .map_or(UNKNOWN_WIDTH, |f| factor_width(f, ctes))
            }
            SelectItem::QualifiedWildcard(..) => UNKNOWN_WIDTH,
            _ => 1,
        })
        .fold(0u64, u64::saturating_add)
}

/// The name a `t.*` finds a relation by: its alias, else its last name part.
fn factor_name(factor: &TableFactor) -> Option<String> {
    let alias = match factor {
        TableFactor::Table { alias, name, .. } => {
            return Some(match alias {
                Some(alias) => alias.name.value.to_ascii_lowercase(),
                None => name.0.last()?.to_string().to_ascii_lowercase(),
            });
        }
        TableFactor::Derived { alias, .. } | TableFactor::NestedJoin { alias, .. } => alias,
        _ => return None,
    };
    alias.as_ref().map(|a| a.name.value.to_ascii_lowercase())
}

/// The columns a `*` takes from one relation of a FROM clause.
fn factor_width(factor: &TableFactor, ctes: &HashMap<String, u64>) -> u64 {
    match factor {
        TableFactor::Table { name, args: None, .. } => {
            let single = match name.0.as_slice() {
                [only] => Some(only.to_string().to_ascii_lowercase()),
                _ => None,
            };
            // A stored row (of a table, or of a view of one table's
            // columns) is one value; a CTE's row is its columns.
            single.and_then(|n| ctes.get(&n).copied()).unwrap_or(1)
        }
        TableFactor::Derived { subquery, .. } => output_width(&subquery.body, ctes),
        TableFactor::NestedJoin { table_with_joins, .. } => {
            let TableWithJoins { relation, joins } = table_with_joins.as_ref();
            std::iter::once(relation)
                .chain(joins.iter().map(|j| &j.relation))
                .map(|f| factor_width(f, ctes))
                .fold(0u64, u64::saturating_add)
        }
        _ => UNKNOWN_WIDTH,
    }
}

/// Tables and views (and table functions) one FROM item reads by name.
fn relations_read(from: &TableWithJoins) -> u64 {
    fn read(factor: &TableFactor) -> u64 {
        match factor {
            TableFactor::Table { .. } => 1,
            TableFactor::NestedJoin { table_with_joins, .. } => relations_read(table_with_joins),
            _ => 0,
        }
    }
    std::iter::once(&from.relation)
        .chain(from.joins.iter().map(|j| &j.relation))
        .map(read)
        .sum()
}

/// What a write's RETURNING list holds (a `*` is the written row: one
/// value), and an UPDATE's new values (one each).
fn returning(statement: &Statement, ctes: &HashMap<String, u64>) -> u64 {
    let (items, assigned) = match statement {
        Statement::Insert(insert) => (insert.returning.as_deref(), 0),
        Statement::Update(update) => (update.returning.as_deref(), update.assignments.len() as u64),
        Statement::Delete(delete) => (delete.returning.as_deref(), 0),
        _ => (None, 0),
    };
    let returned = items.map_or(0, |items| items_width(items, ctes, std::iter::empty));
    returned.saturating_add(assigned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::SQLiteDialect;
    use sqlparser::parser::Parser;

    fn held(sql: &str, row_bytes: usize) -> Result<(), Refusal> {
        let statement = Parser::parse_sql(&SQLiteDialect {}, sql).unwrap().remove(0);
        check(&statement, row_bytes)
    }

    /// The twenty-second read's statement: 64 copies of a column under 14
    /// levels, three times, is refused; one level of it, and what handlers
    /// write, is not.
    #[test]
    fn nested_copies_of_wide_rows_are_refused_and_plain_statements_pass() {
        let columns: Vec<String> = (0..64).map(|i| format!("x.v AS c{i}")).collect();
        let mut chain = format!("SELECT {} FROM t x", columns.join(", "));
        let one_level = format!("SELECT length(c0) FROM ({chain}) LIMIT 1");
        for _ in 0..13 {
            chain = format!("SELECT * FROM ({chain}) LIMIT 1");
        }
        let one = format!("(SELECT length(c0) FROM ({chain}))");
        let attack = format!("SELECT {one}, {one}, {one}");
        match held(&attack, 1 << 20) {
            Err(Refusal::Limit(m)) => assert!(m.contains("values at once"), "{m}"),
            other => panic!("{other:?}"),
        }
        held(&one_level, 1 << 20).unwrap();
        held(&one_level, 8 << 20).unwrap();
        for sql in [
            "SELECT * FROM invoices WHERE id = $1",
            "SELECT a.*, b.* FROM invoices a JOIN customers b ON a.c = b.id",
            "INSERT INTO invoices (id, amount) VALUES ($1, $2), ($3, $4) RETURNING *",
            "WITH c AS (SELECT id, amount FROM invoices) SELECT * FROM c",
            "UPDATE invoices SET amount = amount + 1 WHERE id = $1 RETURNING id, amount",
        ] {
            held(sql, 8 << 20).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        }
    }

    /// A `*` over a CTE or a subquery counts its columns, at every level.
    #[test]
    fn a_star_counts_the_columns_it_takes() {
        let wide: Vec<String> = (0..50).map(|i| format!("v AS c{i}")).collect();
        let cte = format!("WITH w AS (SELECT {} FROM t) SELECT * FROM w", wide.join(", "));
        // 50 in the CTE and 1 for t, 50 again and 1 for w in the SELECT.
        held(&cte, 8 << 20).unwrap_err();
        held(&cte, 1 << 20).unwrap();
        assert_eq!(max_values(8 << 20), 96);
        assert_eq!(max_values(1 << 20), 512);
    }
}
