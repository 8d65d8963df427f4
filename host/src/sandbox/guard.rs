//! The statement guard: the first wall between a guest's SQL and everything
//! that is not the guest's own tables.
//!
//! Every statement is parsed (never grepped) and checked against allowlists:
//! exactly one SELECT, INSERT, UPDATE or DELETE (including inside CTEs); every
//! table it names is one of the handler's own; every function it calls is on
//! a short list of pure functions. Anything else is refused with a message that
//! tells the handler's author what was refused and why. The database's own
//! privileges (PostgreSQL roles, the SQLite authorizer) are the second wall.

use super::{PURE_FUNCTIONS, TABLE_FUNCTIONS, is_reserved};
use crate::db::Backend;
use sqlparser::ast::{
    CastKind, Expr, FromTable, ObjectName, ObjectNamePart, Query, Select, SetExpr, SqliteOnConflict,
    Statement, TableFactor, TableObject, Value, ValueWithSpan, Visit, Visitor,
};
use sqlparser::dialect::{Dialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `sql-error::forbidden`.
    Forbidden(String),
    /// `sql-error::limit`.
    Limit(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Forbidden(m) | Refusal::Limit(m) => f.write_str(m),
        }
    }
}

/// Verdicts remembered per guard. A handler sends the same few statement
/// texts over and over, with different parameters; when a guest sends more
/// distinct texts than this, the memory starts over.
const MAX_VERDICTS: usize = 1024;

/// The SQL dialect the guard parses a backend's statements with.
pub fn dialect(backend: Backend) -> &'static dyn Dialect {
    match backend {
        Backend::Sqlite => &SQLiteDialect {},
        Backend::Postgres => &PostgreSqlDialect {},
    }
}

/// What a handler owns: the tables its migrations created, in its schema.
#[derive(Debug, Clone)]
pub struct Owned {
    /// Lower-case names of the handler's own tables and views.
    pub tables: HashSet<String>,
    /// The schema a qualified own table may name (`handler_x`, or `main` on SQLite).
    pub schema: String,
}

impl Owned {
    pub fn new(schema: &str, tables: &[String]) -> Self {
        Self {
            tables: tables.iter().map(|t| t.to_ascii_lowercase()).collect(),
            schema: schema.to_ascii_lowercase(),
        }
    }

    /// Ok if `name` is one of the handler's tables; the refusal says what it is instead.
    pub fn check(&self, name: &ObjectName, verb: &str) -> Result<(), Refusal> {
        let parts = name_parts(name);
        if parts.len() > 2 {
            return Err(forbidden(format!(
                "cannot {verb} {name}: names with more than two parts are not allowed"
            )));
        }
        let table = parts.last().cloned().unwrap_or_default();
        if is_reserved(&table) {
            return Err(forbidden(format!(
                "cannot {verb} {name}: it is one of the host's tables (or a name the host keeps for them), \
                 which handlers can never touch; deduplication is the host's job"
            )));
        }
        if self.own_name(name).is_none() || !self.tables.contains(&table) {
            let mut own: Vec<&str> = self.tables.iter().map(String::as_str).collect();
            own.sort_unstable();
            return Err(forbidden(format!(
                "cannot {verb} {name}: it is not one of this handler's tables ({}); create tables in the \
                 handler's migrations",
                own.join(", ")
            )));
        }
        Ok(())
    }

    /// The table part of `name` if it names something in the handler's own
    /// schema (unqualified, or qualified with that schema).
    pub fn own_name(&self, name: &ObjectName) -> Option<String> {
        match name_parts(name).as_slice() {
            [table] => Some(table.clone()),
            [schema, table] if *schema == self.schema => Some(table.clone()),
            _ => None,
        }
    }
}

pub struct Guard {
    backend: Backend,
    /// Statement text -> verdict. A verdict depends on the text alone (the
    /// handler's tables are fixed for the guard's life), so parsing it once is enough.
    verdicts: Mutex<HashMap<String, Result<Ctes, Refusal>>>,
    owned: Owned,
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
            owned: Owned::new(own_schema, own_tables),
            max_statement_bytes,
        }
    }

    /// Ok if the statement may run for this handler.
    pub fn check(&self, sql: &str) -> Result<(), Refusal> {
        self.approve(sql).map(drop)
    }

    /// As [`Guard::check`], returning the names of the statement's CTEs
    /// (SQLite's authorizer sees a read of a CTE as a read of that name).
    pub fn approve(&self, sql: &str) -> Result<Ctes, Refusal> {
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
    fn judge(&self, sql: &str) -> Result<Ctes, Refusal> {
        refuse_nul(sql)?;
        let statements = Parser::parse_sql(dialect(self.backend), sql).map_err(|e| {
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
        check_dml(statement, &self.owned, self.backend).map(Ctes::from)
    }
}

/// Regression: SQLite and sqlx stop reading a statement at a NUL byte that
/// the parser took for part of a comment, and sqlx then spun forever on the
/// rest; PostgreSQL calls it a protocol violation. No statement needs one.
pub fn refuse_nul(sql: &str) -> Result<(), Refusal> {
    if sql.contains('\0') {
        return Err(forbidden("the statement contains a NUL character"));
    }
    Ok(())
}

/// Parameters are `$1` .. `$32766`; `$0`, named and bare ones are refused
/// (sqlx's SQLite driver crashed its worker on `$0`).
const MAX_PLACEHOLDER: u32 = 32_766;

/// The CTE names a statement defines.
pub type Ctes = std::sync::Arc<[String]>;

/// Checks one parsed SELECT, INSERT, UPDATE or DELETE: every table it reads or
/// writes is the handler's own and every function it calls is on the list.
/// Anything else is refused with the reason. Ok: the CTE names it defines.
pub fn check_dml(statement: &Statement, owned: &Owned, backend: Backend) -> Result<Vec<String>, Refusal> {
    let mut walk = Walk {
        backend: Some(backend),
        ..Walk::default()
    };
    if let ControlFlow::Break(refusal) = statement.visit(&mut walk) {
        return Err(refusal);
    }
    walk.check(owned)
}

/// Checks what a statement of another kind (a migration's DDL) reads and
/// calls: its expressions' functions, and any table it reads (a view's or a
/// `CREATE TABLE ... AS` query, a subquery in a default).
pub fn check_expressions(
    statement: &Statement,
    owned: &Owned,
    backend: Backend,
) -> Result<Vec<String>, Refusal> {
    let mut walk = Walk {
        kinds_checked: true,
        backend: Some(backend),
        ..Walk::default()
    };
    if let ControlFlow::Break(refusal) = statement.visit(&mut walk) {
        return Err(refusal);
    }
    walk.check(owned)
}

fn forbidden(message: impl Into<String>) -> Refusal {
    Refusal::Forbidden(message.into())
}

pub(crate) fn name_parts(name: &ObjectName) -> Vec<String> {
    name.0
        .iter()
        .map(|part| match part {
            // ASCII only, as both databases fold names: a Unicode fold
            // (the Kelvin sign to `k`) would name a table SQLite does not.
            ObjectNamePart::Identifier(ident) => ident.value.to_ascii_lowercase(),
            other => other.to_string().to_ascii_lowercase(),
        })
        .collect()
}

fn single_name(name: &ObjectName) -> Option<String> {
    match name_parts(name).as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// The common table expressions one query can see.
struct Frame {
    visible: HashSet<String>,
}

/// What a statement reads, writes and calls, gathered in one pass.
///
/// CTE names are scoped as SQL scopes them: a query sees its own WITH names
/// and those of the queries around it; a CTE's body sees only the CTEs before
/// it (and itself, if the WITH is RECURSIVE). A name that no visible CTE
/// defines is a real table, whatever some other query's CTE is called.
#[derive(Default)]
struct Walk {
    relations: Vec<ObjectName>,
    write_targets: Vec<ObjectName>,
    /// Relations that are really set-returning function calls in FROM.
    table_functions: Vec<ObjectName>,
    frames: Vec<Frame>,
    /// CTE bodies not visited yet, by address, with the names visible inside.
    cte_bodies: Vec<(*const Query, HashSet<String>)>,
    /// Every CTE name the statement defines, in any query.
    defined: Vec<String>,
    backend: Option<Backend>,
    /// The statement kind was checked by the caller (migrations): only
    /// expressions and queries are walked.
    kinds_checked: bool,
}

impl Walk {
    fn check(self, owned: &Owned) -> Result<Vec<String>, Refusal> {
        for target in &self.write_targets {
            owned.check(target, "write to")?;
        }
        for relation in &self.relations {
            owned.check(relation, "read")?;
        }
        Ok(self.defined)
    }

    fn visible(&self) -> HashSet<String> {
        self.frames.last().map(|f| f.visible.clone()).unwrap_or_default()
    }

    fn is_cte(&self, name: &ObjectName) -> bool {
        let visible = self.frames.last().map(|f| &f.visible);
        single_name(name).is_some_and(|n| visible.is_some_and(|v| v.contains(&n)))
    }
}

/// `TABLE name` (short for `SELECT * FROM name`) names its table outside any
/// FROM clause, so the visitor does not see it as a relation.
fn table_commands(set: &SetExpr, out: &mut Vec<Result<ObjectName, Refusal>>) {
    match set {
        SetExpr::Table(table) => match &table.table_name {
            Some(name) => {
                let mut parts = Vec::new();
                if let Some(schema) = &table.schema_name {
                    parts.push(schema.clone());
                }
                parts.push(name.clone());
                out.push(Ok(ObjectName::from(parts)));
            }
            None => out.push(Err(forbidden("TABLE without a table name is not allowed"))),
        },
        SetExpr::SetOperation { left, right, .. } => {
            table_commands(left, out);
            table_commands(right, out);
        }
        _ => {}
    }
}

fn rollback_refused() -> Refusal {
    forbidden(
        "OR ROLLBACK would roll back the host's whole transaction (the inbox claim with it): \
         use OR ABORT, OR FAIL, OR IGNORE or OR REPLACE",
    )
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
            Statement::Insert(insert) if insert.or == Some(SqliteOnConflict::Rollback) => {
                return ControlFlow::Break(rollback_refused());
            }
            Statement::Update(update) if update.or == Some(SqliteOnConflict::Rollback) => {
                return ControlFlow::Break(rollback_refused());
            }
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
            _ if self.kinds_checked => {}
            other => return ControlFlow::Break(refuse_kind(other)),
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<Refusal> {
        let address = query as *const Query;
        let base = match self.cte_bodies.iter().position(|(q, _)| *q == address) {
            Some(i) => self.cte_bodies.swap_remove(i).1,
            None => self.visible(),
        };
        let mut visible = base.clone();
        if let Some(with) = &query.with {
            let names: Vec<String> = with
                .cte_tables
                .iter()
                .map(|cte| cte.alias.name.value.to_ascii_lowercase())
                .collect();
            for (i, cte) in with.cte_tables.iter().enumerate() {
                let mut inside = base.clone();
                inside.extend(names[..i].iter().cloned());
                if with.recursive {
                    inside.insert(names[i].clone());
                }
                self.cte_bodies.push((&*cte.query as *const Query, inside));
            }
            self.defined.extend(names.iter().cloned());
            visible.extend(names);
        }
        self.frames.push(Frame { visible });
        let mut tables = Vec::new();
        table_commands(&query.body, &mut tables);
        for table in tables {
            match table {
                Ok(name) if !self.is_cte(&name) => self.relations.push(name),
                Ok(_) => {}
                Err(refusal) => return ControlFlow::Break(refusal),
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _query: &Query) -> ControlFlow<Refusal> {
        self.frames.pop();
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
        if !self.table_functions.iter().any(|f| f == relation) && !self.is_cte(relation) {
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

    fn pre_visit_value(&mut self, value: &ValueWithSpan) -> ControlFlow<Refusal> {
        if let Value::Placeholder(p) = &value.value {
            let number = p
                .strip_prefix('$')
                .filter(|n| !n.starts_with('0'))
                .and_then(|n| n.parse::<u32>().ok());
            if !number.is_some_and(|n| (1..=MAX_PLACEHOLDER).contains(&n)) {
                return ControlFlow::Break(forbidden(format!(
                    "parameter {p} is not allowed: number parameters $1, $2, ... (at most ${MAX_PLACEHOLDER})"
                )));
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<Refusal> {
        // SQLite has no `::` cast: it reads `$1::x(...)` as one parameter
        // name, hiding from the guard what the parser took for a cast.
        if let Expr::Cast {
            kind: CastKind::DoubleColon,
            ..
        } = expr
            && self.backend == Some(Backend::Sqlite)
        {
            return ControlFlow::Break(forbidden(
                "`::` casts are PostgreSQL's: on SQLite write CAST(x AS type)",
            ));
        }
        if let Expr::Function(function) = expr {
            let allowed = single_name(&function.name).is_some_and(|n| PURE_FUNCTIONS.contains(&n.as_str()));
            if !allowed {
                return ControlFlow::Break(forbidden(format!(
                    "function {} is not allowed: handlers may call only pure functions on their own rows \
                     (set_config, file, large-object, extension, remote and padding functions are refused)",
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

    /// Regression: a CTE defined in an inner query made an outer reference to
    /// a real table of the same name count as the CTE (another handler read
    /// billing's invoices on SQLite).
    #[test]
    fn a_cte_name_covers_only_the_queries_that_can_see_it() {
        let other = |sql: &str| {
            for backend in [Backend::Sqlite, Backend::Postgres] {
                let g = Guard::new(backend, "main", &["emails".to_owned()], 4096);
                match g.check(sql) {
                    Err(Refusal::Forbidden(m)) => assert!(m.contains("invoices"), "{backend:?}: {m}"),
                    other => panic!("{backend:?} allowed {sql}: {other:?}"),
                }
            }
        };
        other(
            "SELECT customer_email FROM invoices WHERE EXISTS (WITH invoices AS (SELECT 1) SELECT 1 FROM invoices)",
        );
        other("SELECT * FROM (WITH invoices AS (SELECT 1) SELECT * FROM invoices) x, invoices");
        other("WITH a AS (SELECT * FROM invoices), invoices AS (SELECT 1) SELECT * FROM a");
        other("WITH invoices AS (SELECT * FROM invoices) SELECT * FROM invoices");
        // `TABLE name` is read as what it is (PostgreSQL), or not parsed at all (SQLite).
        for sql in ["SELECT 1 UNION TABLE invoices", "TABLE invoices", "TABLE inbox"] {
            for backend in [Backend::Sqlite, Backend::Postgres] {
                let g = Guard::new(backend, "main", &["emails".to_owned()], 4096);
                assert!(
                    matches!(g.check(sql), Err(Refusal::Forbidden(_))),
                    "{backend:?}: {sql}"
                );
            }
        }
        // Still allowed: a CTE seen where it is in scope, a recursive one inside itself.
        let g = Guard::new(Backend::Sqlite, "main", &["emails".to_owned()], 4096);
        g.check(
            "WITH invoices AS (SELECT 1 AS a) SELECT * FROM invoices WHERE EXISTS (SELECT 1 FROM invoices)",
        )
        .unwrap();
        g.check(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) SELECT * FROM n",
        )
        .unwrap();
    }

    /// Regressions from a hostile review: texts the databases read otherwise
    /// than the parser, and statements that break the host's transaction.
    #[test]
    fn texts_the_databases_read_differently_are_refused() {
        refused("SELECT 1 --\0", "NUL");
        refused("SELECT $0", "parameter $0");
        refused("SELECT $01", "parameter $01");
        refused("INSERT INTO invoices (order_id) VALUES (:name)", "parameter");
        refused(
            "INSERT OR ROLLBACK INTO invoices (order_id) VALUES ($1)",
            "OR ROLLBACK",
        );
        refused("UPDATE OR ROLLBACK invoices SET order_id = $1", "OR ROLLBACK");
        allowed("INSERT OR IGNORE INTO invoices (order_id) VALUES ($1)");
        allowed("SELECT * FROM invoices WHERE order_id = $32766");
        // SQLite reads `$1::t('...')` as one parameter name, hiding the rest.
        let lite = guard(Backend::Sqlite);
        assert!(matches!(
            lite.check("SELECT $1::t('), (SELECT count(*) FROM inbox) --')"),
            Err(Refusal::Forbidden(m)) if m.contains("::")
        ));
        guard(Backend::Postgres)
            .check("SELECT * FROM invoices WHERE order_id = $1::text")
            .unwrap();
        // A CTE named with the Kelvin sign is `k`... only to a Unicode fold.
        let g = Guard::new(Backend::Sqlite, "main", &["emails".to_owned()], 4096);
        assert!(
            g.check("WITH \u{212a}eys AS (SELECT 1) SELECT count(*) FROM keys")
                .is_err()
        );
    }

    #[test]
    fn other_tables_and_schemas_are_refused() {
        refused(
            "SELECT * FROM handler_notifier.emails",
            "not one of this handler's tables",
        );
        refused("SELECT * FROM emails", "not one of this handler's tables");
        refused("SELECT * FROM sqlite_master", "host's tables");
        refused("SELECT * FROM pg_catalog.pg_authid", "host's tables");
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
