//! The statement guard: the first wall between a guest's SQL and everything
//! that is not the guest's own tables.
//!
//! Every statement is parsed (never grepped) and checked against allowlists:
//! exactly one SELECT, INSERT, UPDATE or DELETE (including inside CTEs); every
//! table it names is one of the handler's own; every function it calls is on
//! a short list of pure functions. Anything else is refused with a message that
//! tells the handler's author what was refused and why. The database's own
//! privileges (PostgreSQL roles, the SQLite authorizer) are the second wall.

use super::HOST_TABLES;
use crate::db::Backend;
use sqlparser::ast::{
    Expr, FromTable, ObjectName, ObjectNamePart, Query, Select, Statement, TableFactor, TableObject, Visit,
    Visitor,
};
use sqlparser::dialect::{Dialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Mutex;

/// Scalar and aggregate functions with no side effects and no access to
/// anything outside the statement's own rows.
const FUNCTIONS: &[&str] = &[
    "abs",
    "avg",
    "bool_and",
    "bool_or",
    "ceil",
    "ceiling",
    "char_length",
    "coalesce",
    "concat",
    "concat_ws",
    "count",
    "date",
    "date_part",
    "date_trunc",
    "datetime",
    "every",
    "floor",
    "format",
    "gen_random_uuid",
    "greatest",
    "group_concat",
    "hex",
    "ifnull",
    "iif",
    "instr",
    "json_agg",
    "json_array",
    "json_build_array",
    "json_build_object",
    "json_extract",
    "json_object",
    "jsonb_agg",
    "jsonb_build_array",
    "jsonb_build_object",
    "julianday",
    "least",
    "left",
    "length",
    "lower",
    "lpad",
    "ltrim",
    "max",
    "md5",
    "min",
    "mod",
    "now",
    "nullif",
    "position",
    "power",
    "printf",
    "random",
    "replace",
    "right",
    "round",
    "rpad",
    "rtrim",
    "sign",
    "sqrt",
    "strftime",
    "string_agg",
    "substr",
    "substring",
    "sum",
    "to_char",
    "to_timestamp",
    "total",
    "trim",
    "trunc",
    "typeof",
    "unixepoch",
    "upper",
    "array_agg",
    "row_number",
    "rank",
    "dense_rank",
    "lag",
    "lead",
];

/// Set-returning functions allowed in FROM.
const TABLE_FUNCTIONS: &[&str] = &[
    "generate_series",
    "json_each",
    "json_tree",
    "jsonb_array_elements",
    "jsonb_each",
    "unnest",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `sql-error::forbidden`.
    Forbidden(String),
    /// `sql-error::limit`.
    Limit(String),
}

/// Verdicts remembered per guard. A handler sends the same few statement
/// texts over and over, with different parameters; when a guest sends more
/// distinct texts than this, the memory starts over.
const MAX_VERDICTS: usize = 1024;

pub struct Guard {
    backend: Backend,
    /// Statement text -> verdict. A verdict depends on the text alone (the
    /// handler's tables are fixed for the guard's life), so parsing it once is enough.
    verdicts: Mutex<HashMap<String, Result<(), Refusal>>>,
    /// Lower-case names of the handler's own tables.
    own_tables: HashSet<String>,
    /// The schema a qualified own table may name (`handler_x`, or `main` on SQLite).
    own_schema: String,
    max_statement_bytes: usize,
}

impl Guard {
    pub fn new(
        backend: Backend,
        own_schema: &str,
        own_tables: &[String],
        max_statement_bytes: usize,
    ) -> Self {
        Self {
            backend,
            verdicts: Mutex::default(),
            own_tables: own_tables.iter().map(|t| t.to_lowercase()).collect(),
            own_schema: own_schema.to_lowercase(),
            max_statement_bytes,
        }
    }

    /// Ok if the statement may run for this handler.
    pub fn check(&self, sql: &str) -> Result<(), Refusal> {
        if sql.len() > self.max_statement_bytes {
            return Err(Refusal::Limit(format!(
                "limits.max_statement_bytes: the statement is {} bytes; the limit is {}",
                sql.len(),
                self.max_statement_bytes
            )));
        }
        let mut verdicts = self.verdicts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(verdict) = verdicts.get(sql) {
            return verdict.clone();
        }
        let verdict = self.judge(sql);
        if verdicts.len() >= MAX_VERDICTS {
            verdicts.clear();
        }
        verdicts.insert(sql.to_owned(), verdict.clone());
        verdict
    }

    /// Parses and checks one statement text.
    fn judge(&self, sql: &str) -> Result<(), Refusal> {
        let dialect: &dyn Dialect = match self.backend {
            Backend::Sqlite => &SQLiteDialect {},
            Backend::Postgres => &PostgreSqlDialect {},
        };
        let statements = Parser::parse_sql(dialect, sql).map_err(|e| {
            forbidden(format!(
                "the statement guard cannot parse this statement ({e}); only single SELECT, INSERT, UPDATE \
                 and DELETE statements on the handler's own tables are allowed"
            ))
        })?;
        let statement = match statements.as_slice() {
            [one] => one,
            [] => return Err(forbidden("the statement is empty")),
            many => {
                return Err(forbidden(format!(
                    "one statement per call, got {}: send each statement in its own call",
                    many.len()
                )));
            }
        };
        let mut walk = Walk::default();
        if let ControlFlow::Break(refusal) = statement.visit(&mut walk) {
            return Err(refusal);
        }
        for target in &walk.write_targets {
            self.check_table(target, "write to")?;
        }
        for relation in &walk.relations {
            let is_cte = single_name(relation).is_some_and(|n| walk.cte_names.contains(&n));
            if !is_cte {
                self.check_table(relation, "read")?;
            }
        }
        Ok(())
    }

    fn check_table(&self, name: &ObjectName, verb: &str) -> Result<(), Refusal> {
        let parts = name_parts(name);
        let (schema, table) = match parts.as_slice() {
            [table] => (None, table.clone()),
            [schema, table] => (Some(schema.clone()), table.clone()),
            _ => {
                return Err(forbidden(format!(
                    "cannot {verb} {name}: names with more than two parts are not allowed"
                )));
            }
        };
        // inbox_default and inbox_dNNNNN are the inbox's PostgreSQL partitions.
        if HOST_TABLES.contains(&table.as_str()) || table.starts_with("inbox_d") {
            return Err(forbidden(format!(
                "cannot {verb} {name}: it is one of the host's tables, which handlers can never touch; \
                 deduplication is the host's job"
            )));
        }
        let own_schema = schema.as_ref().is_none_or(|s| *s == self.own_schema);
        if !own_schema || !self.own_tables.contains(&table) {
            let mut own: Vec<&str> = self.own_tables.iter().map(String::as_str).collect();
            own.sort_unstable();
            return Err(forbidden(format!(
                "cannot {verb} {name}: it is not one of this handler's tables ({}); create tables in the \
                 handler's migrations",
                own.join(", ")
            )));
        }
        Ok(())
    }
}

fn forbidden(message: impl Into<String>) -> Refusal {
    Refusal::Forbidden(message.into())
}

fn name_parts(name: &ObjectName) -> Vec<String> {
    name.0
        .iter()
        .map(|part| match part {
            ObjectNamePart::Identifier(ident) => ident.value.to_lowercase(),
            other => other.to_string().to_lowercase(),
        })
        .collect()
}

fn single_name(name: &ObjectName) -> Option<String> {
    match name_parts(name).as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// What a statement reads, writes and calls, gathered in one pass.
#[derive(Default)]
struct Walk {
    relations: Vec<ObjectName>,
    write_targets: Vec<ObjectName>,
    cte_names: HashSet<String>,
    /// Relations that are really set-returning function calls in FROM.
    table_functions: Vec<ObjectName>,
}

/// Why a statement kind is refused, in words a handler author can act on.
fn refuse_kind(statement: &Statement) -> Refusal {
    let text = statement.to_string();
    let words: Vec<&str> = text.split_whitespace().take(2).collect();
    let kind = words.join(" ").to_uppercase();
    let reason = match statement {
        Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. } => {
            "transaction control is the host's: your statements already run inside the event's transaction, \
             which commits with the inbox claim"
        }
        Statement::Set(_) => "session settings and role changes are not allowed",
        Statement::Copy { .. } => "COPY reads and writes server files",
        Statement::Pragma { .. } | Statement::AttachDatabase { .. } | Statement::Vacuum(_) => {
            "database-level commands are not allowed"
        }
        Statement::CreateTable(_)
        | Statement::CreateView(_)
        | Statement::CreateIndex(_)
        | Statement::CreateTrigger(_)
        | Statement::CreateFunction(_)
        | Statement::Drop { .. }
        | Statement::AlterTable(_) => "schema changes belong in the handler's migrations, not at run time",
        _ => "only SELECT, INSERT, UPDATE and DELETE are allowed",
    };
    forbidden(format!("{kind} is not allowed: {reason}"))
}

impl Visitor for Walk {
    type Break = Refusal;

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<Refusal> {
        match statement {
            Statement::Query(_) => {}
            Statement::Insert(insert) => match &insert.table {
                TableObject::TableName(name) => self.write_targets.push(name.clone()),
                other => return ControlFlow::Break(forbidden(format!("cannot insert into {other}"))),
            },
            Statement::Update(update) => match &update.table.relation {
                TableFactor::Table { name, .. } => self.write_targets.push(name.clone()),
                other => return ControlFlow::Break(forbidden(format!("cannot update {other}"))),
            },
            Statement::Delete(delete) => {
                let from = match &delete.from {
                    FromTable::WithFromKeyword(tables) | FromTable::WithoutKeyword(tables) => tables,
                };
                if !delete.tables.is_empty() || from.len() != 1 {
                    return ControlFlow::Break(forbidden("DELETE must name exactly one table"));
                }
                match &from[0].relation {
                    TableFactor::Table { name, .. } => self.write_targets.push(name.clone()),
                    other => return ControlFlow::Break(forbidden(format!("cannot delete from {other}"))),
                }
            }
            other => return ControlFlow::Break(refuse_kind(other)),
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<Refusal> {
        if let Some(with) = &query.with {
            for cte in &with.cte_tables {
                self.cte_names.insert(cte.alias.name.value.to_lowercase());
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<Refusal> {
        if select.into.is_some() {
            return ControlFlow::Break(forbidden(
                "SELECT ... INTO creates a table: schema changes belong in the handler's migrations",
            ));
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<Refusal> {
        if !self.table_functions.iter().any(|f| f == relation) {
            self.relations.push(relation.clone());
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<Refusal> {
        match factor {
            TableFactor::Table {
                name, args: Some(_), ..
            }
            | TableFactor::Function { name, .. } => {
                let allowed = single_name(name).is_some_and(|n| TABLE_FUNCTIONS.contains(&n.as_str()));
                if !allowed {
                    return ControlFlow::Break(forbidden(format!(
                        "function {name} is not on the allowlist of table functions ({})",
                        TABLE_FUNCTIONS.join(", ")
                    )));
                }
                self.table_functions.push(name.clone());
            }
            TableFactor::TableFunction { .. } => {
                return ControlFlow::Break(forbidden("TABLE(...) functions are not allowed"));
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<Refusal> {
        if let Expr::Function(function) = expr {
            let allowed = single_name(&function.name).is_some_and(|n| FUNCTIONS.contains(&n.as_str()));
            if !allowed {
                return ControlFlow::Break(forbidden(format!(
                    "function {} is not allowed: handlers may call only pure functions on their own rows \
                     (set_config, file, large-object, extension and remote functions are refused)",
                    function.name
                )));
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(backend: Backend) -> Guard {
        let schema = if backend == Backend::Sqlite {
            "main"
        } else {
            "handler_billing"
        };
        Guard::new(
            backend,
            schema,
            &["invoices".to_owned(), "customers".to_owned()],
            4096,
        )
    }

    fn allowed(sql: &str) {
        for backend in [Backend::Sqlite, Backend::Postgres] {
            assert_eq!(
                guard(backend).check(sql),
                Ok(()),
                "{backend:?} should allow: {sql}"
            );
        }
    }

    fn refused(sql: &str, because: &str) {
        for backend in [Backend::Sqlite, Backend::Postgres] {
            match guard(backend).check(sql) {
                Err(Refusal::Forbidden(m)) | Err(Refusal::Limit(m)) => {
                    assert!(
                        m.contains(because),
                        "{backend:?}: {sql}\n  refused with {m:?}, expected {because:?}"
                    )
                }
                Ok(()) => panic!("{backend:?} allowed: {sql}"),
            }
        }
    }

    #[test]
    fn the_handlers_own_dml_and_reads_pass() {
        allowed("INSERT INTO invoices (order_id, amount_cents) VALUES ($1, $2)");
        allowed("insert into INVOICES (order_id) values ($1) on conflict do nothing");
        allowed("UPDATE invoices SET amount_cents = amount_cents + 1 WHERE order_id = $1");
        allowed("DELETE FROM invoices WHERE order_id = $1");
        allowed(
            "SELECT count(*), max(amount_cents) FROM invoices i JOIN customers c ON c.id = i.customer_id",
        );
        allowed("WITH recent AS (SELECT * FROM invoices) SELECT * FROM recent");
        allowed("SELECT ';DELETE FROM inbox' AS harmless_text");
        allowed("SELECT 1 /* ; DELETE FROM inbox */");
        allowed("SELECT * FROM generate_series(1, 3)");
    }

    #[test]
    fn host_tables_are_refused_however_they_are_spelled() {
        for sql in [
            "DELETE FROM inbox",
            "delete from INBOX where 1 = 1",
            "DELETE FROM \"inbox\"",
            "UPDATE offsets SET next_offset = 0",
            "INSERT INTO inbox (handler, event_id) VALUES ('billing', 'x')",
            "DELETE FROM main.inbox",
            "DELETE FROM inboxd.inbox",
            "DELETE/**/FROM/**/inbox",
            "SELECT * FROM invoices WHERE order_id IN (SELECT event_id FROM inbox)",
            "WITH gone AS (DELETE FROM inbox RETURNING *) SELECT count(*) FROM gone",
            "INSERT INTO invoices SELECT * FROM dead_letters",
        ] {
            refused(sql, "host's tables");
        }
    }

    #[test]
    fn a_cte_cannot_stand_in_for_a_host_table_as_a_write_target() {
        refused("WITH inbox AS (SELECT 1) DELETE FROM inbox", "host's tables");
        refused("WITH invoices AS (SELECT 1) DELETE FROM offsets", "host's tables");
    }

    #[test]
    fn other_tables_and_schemas_are_refused() {
        refused(
            "SELECT * FROM handler_notifier.emails",
            "not one of this handler's tables",
        );
        refused("SELECT * FROM emails", "not one of this handler's tables");
        refused("SELECT * FROM sqlite_master", "not one of this handler's tables");
        refused(
            "SELECT * FROM pg_catalog.pg_authid",
            "not one of this handler's tables",
        );
        refused("SELECT * FROM a.b.c", "more than two parts");
    }

    #[test]
    fn transaction_control_session_and_ddl_are_refused() {
        for sql in [
            "BEGIN",
            "COMMIT",
            "ROLLBACK",
            "SAVEPOINT s",
            "RELEASE SAVEPOINT s",
        ] {
            refused(sql, "transaction control is the host's");
        }
        for sql in [
            "DROP TABLE invoices",
            "ALTER TABLE invoices ADD COLUMN x TEXT",
            "CREATE TABLE t (a INT)",
        ] {
            refused(sql, "belong in the handler's migrations");
        }
        refused("CREATE VIEW v AS SELECT * FROM inbox", "not allowed");
        refused(
            "CREATE TRIGGER t AFTER INSERT ON invoices BEGIN DELETE FROM inbox; END",
            "not allowed",
        );
    }

    #[test]
    fn postgres_session_and_server_functions_are_refused() {
        let pg = guard(Backend::Postgres);
        for sql in [
            "SET ROLE postgres",
            "SET SESSION AUTHORIZATION postgres",
            "SET search_path = inboxd",
        ] {
            assert!(
                matches!(pg.check(sql), Err(Refusal::Forbidden(m)) if m.contains("role changes")),
                "{sql}"
            );
        }
        for sql in [
            "SELECT set_config('role', 'postgres', true)",
            "SELECT pg_read_file('/etc/passwd')",
            "SELECT lo_import('/etc/passwd')",
            "SELECT * FROM dblink('host=x', 'DELETE FROM inbox') AS t(a int)",
            "SELECT pg_catalog.set_config('role', 'postgres', true)",
        ] {
            assert!(matches!(pg.check(sql), Err(Refusal::Forbidden(_))), "{sql}");
        }
        assert!(pg.check("RESET ROLE").is_err());
        assert!(pg.check("COPY invoices TO '/tmp/x'").is_err());
        assert!(pg.check("LISTEN x").is_err());
        assert!(pg.check("DO $$ BEGIN DELETE FROM inboxd.inbox; END $$").is_err());
        assert!(pg.check("CALL p()").is_err());
    }

    #[test]
    fn sqlite_database_commands_are_refused() {
        let lite = guard(Backend::Sqlite);
        for sql in [
            "ATTACH DATABASE '/tmp/x.db' AS x",
            "PRAGMA writable_schema = ON",
            "VACUUM INTO '/tmp/copy.db'",
            "SELECT load_extension('/tmp/evil.so')",
        ] {
            assert!(matches!(lite.check(sql), Err(Refusal::Forbidden(_))), "{sql}");
        }
    }

    #[test]
    fn two_statements_and_oversized_ones_are_refused() {
        refused(
            "INSERT INTO invoices VALUES (1); DELETE FROM inbox",
            "one statement per call",
        );
        refused("SELECT 1; SELECT 2", "one statement per call");
        let huge = format!("SELECT '{}'", "x".repeat(5000));
        refused(&huge, "limits.max_statement_bytes");
    }
}
