//! One pass over a parsed statement: what it reads, writes and calls, with
//! CTE names scoped as SQL scopes them. The statement guard ([`super::guard`])
//! and the migration guard ([`super::migration`]) both judge statements with it.

use super::guard::{Owned, Refusal, forbidden, name_parts};
use super::{PURE_FUNCTIONS, TABLE_FUNCTIONS};
use crate::config::Backend;
use sqlparser::ast::{
    CastKind, Expr, FromTable, ObjectName, Query, Select, SetExpr, SqliteOnConflict, Statement, TableFactor,
    TableObject, Value, ValueWithSpan, Visit, Visitor,
};
use std::collections::HashSet;
use std::ops::ControlFlow;

/// Parameters are `$1` .. `$32766`; `$0`, named and bare ones are refused
/// (sqlx's SQLite driver crashed its worker on `$0`).
const MAX_PLACEHOLDER: u32 = 32_766;

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
