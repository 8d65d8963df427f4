//! SQLite's upsert and the per-row work bound (`super::sqlite_work`).
//!
//! The bound splits what one row may take without an interrupt (a second at
//! the row bound) in two halves: a statement's own calls, and its table's
//! CHECK, DEFAULT and generated expressions, which SQLite runs inside the
//! same row's straight-line code. An `INSERT ... ON CONFLICT DO UPDATE` runs
//! the table's expressions twice in that row, for the row it tried to insert
//! and again for the row it updates, so its own calls and the table's
//! together must fit the statement's half (the thirty-first adversarial
//! read, issue 23: otherwise one row could take 1.5 times the bound).

use super::guard::Refusal;
use super::sqlite_work::{calls, last_name, max_calls};
use sqlparser::ast::{
    Insert, OnConflict, OnConflictAction, OnInsert, Statement, TableObject, Visit, Visitor,
};
use std::collections::BTreeMap;
use std::ops::ControlFlow;

/// Calls and operators in each of a handler's tables' stored definitions,
/// by lower-case table name (`db::migrate::sqlite_table_calls`).
pub type TableCalls = BTreeMap<String, u64>;

/// Refuses an upsert whose calls plus its table's exceed [`max_calls`].
/// A table not in `tables` counts nothing (a table the guard does not know
/// is refused elsewhere).
pub fn check(statement: &Statement, row_bytes: usize, tables: &TableCalls) -> Result<(), Refusal> {
    let mut upserts = Upserts(Vec::new());
    let _ = statement.visit(&mut upserts);
    if upserts.0.is_empty() {
        return Ok(());
    }
    let own = calls(statement);
    let max = max_calls(row_bytes);
    for table in upserts.0 {
        let stored = tables.get(&table).copied().unwrap_or(0);
        if own.saturating_add(stored) > max {
            return Err(Refusal::Limit(format!(
                "this INSERT ... ON CONFLICT DO UPDATE makes {own} calls and operators, and table {table}'s \
                 CHECK, DEFAULT and generated expressions {stored} more, which SQLite runs twice for a \
                 row it updates this way; at limits.max_row_bytes = {row_bytes} at most {max} fit together \
                 the time SQLite cannot interrupt: split the statement, or use a plain INSERT or UPDATE"
            )));
        }
    }
    Ok(())
}

/// The target tables of every `ON CONFLICT ... DO UPDATE` in a statement.
struct Upserts(Vec<String>);

impl Visitor for Upserts {
    type Break = ();

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<()> {
        if let Statement::Insert(Insert {
            table: TableObject::TableName(name),
            on:
                Some(OnInsert::OnConflict(OnConflict {
                    action: OnConflictAction::DoUpdate(_),
                    ..
                })),
            ..
        }) = statement
        {
            self.0.push(last_name(name));
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::SQLiteDialect;
    use sqlparser::parser::Parser;

    fn statement(sql: &str) -> Statement {
        Parser::parse_sql(&SQLiteDialect {}, sql).unwrap().remove(0)
    }

    #[test]
    fn an_upsert_counts_its_tables_expressions_once_more() {
        let row_bytes = 1 << 20;
        let max = max_calls(row_bytes);
        let tables = TableCalls::from([("t".to_owned(), max - 2)]);
        let light = "INSERT INTO t (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v";
        check(&statement(light), row_bytes, &tables).unwrap();
        let heavy = "INSERT INTO t (k, v) VALUES ($1, upper($2)) ON CONFLICT (k) DO UPDATE SET v = \
                     lower(upper(excluded.v))";
        let refusal = check(&statement(heavy), row_bytes, &tables)
            .unwrap_err()
            .to_string();
        assert!(refusal.contains("SQLite runs twice"), "{refusal}");
        // Behind a WITH, in the spelling T (not t), the same.
        let with = format!("WITH c AS (SELECT 1) {}", heavy.replace("INTO t", "INTO T"));
        assert!(check(&statement(&with), row_bytes, &tables).is_err());
        // Not a DO NOTHING, nor a plain INSERT: the table's expressions run once.
        for once in [
            "INSERT INTO t (k, v) VALUES ($1, upper($2)) ON CONFLICT (k) DO NOTHING",
            "INSERT INTO t (k, v) VALUES ($1, lower(upper($2)))",
        ] {
            check(&statement(once), row_bytes, &tables).unwrap();
        }
    }
}
