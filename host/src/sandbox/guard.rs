//! The statement guard: the first wall between a guest's SQL and everything
//! that is not the guest's own tables.
//!
//! Every statement is parsed (never grepped) and checked against allowlists:
//! exactly one SELECT, INSERT, UPDATE or DELETE (including inside CTEs); every
//! table it names is one of the handler's own; every function it calls is on
//! a short list of pure functions, every expression of a plain kind and every
//! cast to a plain type. On PostgreSQL the same text is then read by
//! PostgreSQL's own parser and judged again ([`super::postgres`]), so syntax
//! the two parsers read differently cannot pass. Its depth is bounded before
//! either parses it ([`super::nesting`]). Anything else is refused with a
//! message that tells the handler's author what was refused and why. The
//! database's own privileges (PostgreSQL: the handler's own login; SQLite:
//! the authorizer) are the second wall.

use super::is_reserved;
pub use super::walk::{check_dml, check_expressions};
use crate::config::Backend;
use sqlparser::ast::{ObjectName, ObjectNamePart};
use sqlparser::dialect::{Dialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

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
/// distinct texts than this, or texts of more bytes than [`MAX_VERDICT_BYTES`]
/// in all, the memory starts over.
const MAX_VERDICTS: usize = 1024;

/// Statement text the verdict memory holds per guard, at most: without it,
/// 1,024 texts at the team ceiling of `limits.max_statement_bytes` (1 MiB)
/// would hold a GiB per handler version (issue 23).
const MAX_VERDICT_BYTES: usize = 4 << 20;

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
    verdicts: Mutex<Verdicts>,
    /// Turns to judge a new text from a guest call (see [`Guard::judges`]).
    judges: std::sync::Arc<tokio::sync::Semaphore>,
    owned: Owned,
    max_statement_bytes: usize,
    /// `limits.max_row_bytes`: the largest row and bound value (see `super::work`).
    max_row_bytes: usize,
    /// SQLite: the longest row stored (see [`Guard::with_stored_row_bytes`]).
    stored_row_bytes: usize,
    /// SQLite: each own table's stored expressions (see [`Guard::with_table_calls`]).
    table_calls: super::sqlite_upsert::TableCalls,
    /// PostgreSQL: what the guard knows of the database (each own table's
    /// own expressions, the functions it could call on a whole row).
    catalog: super::postgres::Catalog,
}

impl Guard {
    pub fn new(
        backend: Backend,
        own_schema: &str,
        own_tables: &[String],
        max_statement_bytes: usize,
        max_row_bytes: usize,
    ) -> Self {
        Self {
            backend,
            verdicts: Mutex::default(),
            judges: std::sync::Arc::new(tokio::sync::Semaphore::new(JUDGES)),
            owned: Owned::new(own_schema, own_tables),
            max_statement_bytes,
            max_row_bytes,
            stored_row_bytes: 0,
            table_calls: Default::default(),
            catalog: Default::default(),
        }
    }

    /// SQLite: the longest row the handler's tables may hold, when longer than
    /// its `limits.max_row_bytes` (rows written under a larger limit, or by a
    /// migration): the per-row work and the values a statement holds are
    /// counted at this size (`db::migrate::row_bound::sqlite_row_bound`).
    pub fn with_stored_row_bytes(mut self, bytes: usize) -> Self {
        self.stored_row_bytes = bytes;
        self
    }

    /// SQLite: the calls and operators in each own table's CHECK, DEFAULT and
    /// generated expressions, which an upsert runs twice
    /// (`db::migrate::sqlite_table_calls`, `super::sqlite_upsert`).
    pub fn with_table_calls(mut self, tables: super::sqlite_upsert::TableCalls) -> Self {
        self.table_calls = tables;
        self
    }

    /// The work a write to each own table adds by that table's CHECK,
    /// DEFAULT, generated and index expressions (`db::migrate::hidden_work`).
    pub fn with_hidden_work(mut self, hidden: super::postgres::Hidden) -> Self {
        self.catalog.hidden = hidden;
        self
    }

    /// The functions PostgreSQL could call on a whole row
    /// (`db::migrate::row_functions`): a qualified name that is one of them is refused.
    pub fn with_row_functions(mut self, functions: std::collections::BTreeSet<String>) -> Self {
        self.catalog.row_functions = Some(functions);
        self
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// `limits.max_row_bytes`, which also bounds each value a statement binds.
    pub fn max_row_bytes(&self) -> usize {
        self.max_row_bytes
    }

    /// Ok if the statement may run for this handler.
    pub fn check(&self, sql: &str) -> Result<(), Refusal> {
        self.approve(sql).map(drop)
    }

    /// Guest calls take a turn here (waiting, not on a thread) before they
    /// judge a new text on a blocking thread: a handler version's calls in
    /// flight (up to its connections) each judging a new 1 MiB text at once
    /// were as many cores and parse trees (the thirteenth read).
    pub fn judges(&self) -> std::sync::Arc<tokio::sync::Semaphore> {
        self.judges.clone()
    }

    /// The verdict on `sql` if the guard has already judged that text (or
    /// it is too long to judge): no parse, so an async caller may take it inline.
    pub fn remembered(&self, sql: &str) -> Option<Result<Approved, Refusal>> {
        if sql.len() > self.max_statement_bytes {
            return Some(self.approve(sql));
        }
        let verdicts = self.verdicts.lock().unwrap_or_else(|p| p.into_inner());
        verdicts.by_text.get(sql).cloned()
    }

    /// As [`Guard::check`], returning the names of the statement's CTEs
    /// (SQLite's authorizer sees a read of a CTE as a read of that name).
    /// A new text is parsed and walked here, which takes up to milliseconds:
    /// async callers use [`Guard::remembered`] first and run this on a
    /// blocking thread.
    pub fn approve(&self, sql: &str) -> Result<Approved, Refusal> {
        if sql.len() > self.max_statement_bytes {
            return Err(Refusal::Limit(format!(
                "limits.max_statement_bytes: the statement is {} bytes; the limit is {}",
                sql.len(),
                self.max_statement_bytes
            )));
        }
        if let Some(verdict) = self.remembered(sql) {
            return verdict;
        }
        // Judged without the lock: `remembered` takes it on runtime
        // workers, so a lock held through a judge (up to a second for a
        // long text) blocked every worker that looked up a verdict of this
        // version meanwhile, and with them every handler, the relay and the
        // admin API (the eleventh read). Two calls judging one new text at
        // once both judge it; the verdict is the same.
        let verdict = self.judge(sql);
        self.verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remember(sql, verdict.clone());
        verdict
    }

    /// Statement text bytes the verdict memory holds now (tests).
    #[cfg(test)]
    fn remembered_bytes(&self) -> usize {
        self.verdicts.lock().unwrap().bytes
    }

    /// Parses and checks one statement text: its depth first, from its
    /// tokens, then the tree on a thread with a stack sized for that depth
    /// (see [`super::nesting`]), where the tree is also dropped.
    fn judge(&self, sql: &str) -> Result<Approved, Refusal> {
        refuse_nul(sql)?;
        super::nesting::check(dialect(self.backend), sql)?;
        super::nesting::on_guard_stack(|| self.judge_tree(sql))
    }

    fn judge_tree(&self, sql: &str) -> Result<Approved, Refusal> {
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
        let ctes = check_dml(statement, &self.owned, self.backend)?;
        let mut insert = None;
        let mut keep_prepared = true;
        let mut zoned_params = Vec::new();
        if self.backend == Backend::Sqlite {
            let row_bytes = self.max_row_bytes.max(self.stored_row_bytes);
            super::sqlite_work::check(statement, row_bytes)?;
            super::sqlite_upsert::check(statement, row_bytes, &self.table_calls)?;
        }
        if self.backend == Backend::Postgres {
            // The same text as PostgreSQL itself reads it (see `super::postgres`).
            let checked = super::postgres::check_run_time(sql, self.max_row_bytes as u64, &self.catalog)?;
            keep_prepared = checked.keep_prepared;
            zoned_params = checked.zoned_params;
            match checked.statements {
                1 => {}
                n => {
                    return Err(forbidden(format!(
                        "PostgreSQL reads {n} statements in this text: send one statement per call"
                    )));
                }
            }
            insert = super::postgres::PlainInsert::of(sql).map(Arc::new);
        }
        Ok(Approved {
            ctes: Ctes::from(ctes),
            insert,
            keep_prepared,
            zoned_params,
        })
    }
}

/// Statement text -> verdict, bounded in count and bytes.
#[derive(Default)]
struct Verdicts {
    by_text: HashMap<String, Result<Approved, Refusal>>,
    bytes: usize,
}

impl Verdicts {
    fn remember(&mut self, sql: &str, verdict: Result<Approved, Refusal>) {
        if sql.len() > MAX_VERDICT_BYTES || self.by_text.contains_key(sql) {
            return;
        }
        if self.by_text.len() >= MAX_VERDICTS || self.bytes + sql.len() > MAX_VERDICT_BYTES {
            self.by_text.clear();
            self.bytes = 0;
        }
        self.bytes += sql.len();
        self.by_text.insert(sql.to_owned(), verdict);
    }
}

/// New texts a handler version's guest calls judge at once, at most.
const JUDGES: usize = 2;

/// Regression: SQLite and sqlx stop reading a statement at a NUL byte that
/// the parser took for part of a comment, and sqlx then spun forever on the
/// rest; PostgreSQL calls it a protocol violation. No statement needs one.
pub fn refuse_nul(sql: &str) -> Result<(), Refusal> {
    if sql.contains('\0') {
        return Err(forbidden("the statement contains a NUL character"));
    }
    Ok(())
}

/// The CTE names a statement defines.
pub type Ctes = std::sync::Arc<[String]>;

/// What the guard approved a statement with.
#[derive(Debug, Clone)]
pub struct Approved {
    /// Its CTEs' names (SQLite's authorizer sees a read of a CTE as a read of that name).
    pub ctes: Ctes,
    /// PostgreSQL: it is a plain one-row INSERT, which the host may send
    /// with others of the same text as one statement (see `db::deferred`).
    pub insert: Option<Arc<super::postgres::PlainInsert>>,
    /// PostgreSQL: the handler's session may keep it prepared (see
    /// `super::postgres::plan_cache`).
    pub keep_prepared: bool,
    /// PostgreSQL: the parameters (numbered from 1) a date or time cast
    /// reads as text, each checked with `postgres::zone_free` when bound.
    pub zoned_params: Vec<usize>,
}

pub(crate) fn forbidden(message: impl Into<String>) -> Refusal {
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

#[cfg(test)]
mod tests;
