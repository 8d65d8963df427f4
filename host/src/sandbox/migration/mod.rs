//! The statement guard for a handler's migrations: parsed, allowlisted and
//! cut into single statements that run one at a time.
//!
//! A migration file is a team's SQL, as untrusted as its component. It is
//! parsed whole; every statement must be on the allowlist below; then the text
//! is cut at its top-level semicolons (by the SQL tokenizer, so a `;` inside a
//! string or a comment is not a cut), and each piece must parse back to
//! exactly the statement that was checked. The pieces then run one by one
//! inside the handler's walls, each checked again against the tables the
//! handler owns at that moment (earlier statements of the file create them).
//!
//! Allowed: CREATE TABLE, CREATE INDEX, CREATE VIEW (over the handler's own
//! tables), ALTER TABLE (columns, renames, constraints) and DROP TABLE / VIEW /
//! INDEX of its own, and INSERT / UPDATE / DELETE / SELECT of its own rows.
//! Every expression (defaults, checks, generated columns, index expressions)
//! may call only the pure functions the run-time guard allows, and a foreign
//! key may point only at the handler's own tables. Refused with a reason:
//! functions, procedures, triggers, rules, policies, DO, SET/RESET,
//! transaction control, temporary or unlogged-to-another-schema objects,
//! extensions, types, sequences, schemas, roles, grants, COPY, and anything
//! not on the list. No code a migration could plant is allowed, so nothing
//! runs later outside the walls.

use super::guard::{Owned, Refusal, check_dml, check_expressions, dialect, name_parts, refuse_nul};
use super::{TABLE_FUNCTIONS, is_reserved};
use crate::config::Backend;
use sqlparser::ast::{
    AlterTableOperation, ColumnOption, ObjectName, ObjectType, RenameTableNameKind, Statement,
    TableConstraint,
};
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Location, Token, Tokenizer};

mod split;
pub use split::{Piece, split};

/// The row bound a migration's expressions are counted at (see
/// `super::work`): the default of `limits.max_row_bytes`, since a migration
/// is checked before any handler's limits apply to it.
const SCHEMA_ROW_BYTES: u64 = crate::config::defaults::MAX_ROW_BYTES as u64;

/// Checks a statement against the tables the handler owns right before it runs.
pub fn check(piece: &Piece, owned: &Owned) -> Result<(), Refusal> {
    check_at(piece, owned, SCHEMA_ROW_BYTES as usize)
}

/// As [`check`], SQLite's per-row bounds counting rows of `row_bytes` (at
/// least [`SCHEMA_ROW_BYTES`]: the longest row the handler's tables may hold,
/// `db::migrate::row_bound::sqlite_recorded_in`).
pub fn check_at(piece: &Piece, owned: &Owned, row_bytes: usize) -> Result<(), Refusal> {
    let row_bytes = row_bytes.max(SCHEMA_ROW_BYTES as usize);
    super::nesting::on_guard_stack(|| {
        check_owned(&piece.statement, owned, piece.backend, row_bytes).map_err(|r| about(&piece.statement, r))
    })
}

fn about(statement: &Statement, refusal: Refusal) -> Refusal {
    let mut text = statement.to_string();
    if text.len() > 200 {
        let mut cut = 200;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    forbidden(format!("statement `{text}` is refused: {refusal}"))
}

fn forbidden(message: impl Into<String>) -> Refusal {
    Refusal::Forbidden(message.into())
}

/// The statement kinds a migration may contain, with what makes each one safe.
fn check_kind(statement: &Statement) -> Result<(), Refusal> {
    match statement {
        Statement::Query(_) | Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => Ok(()),
        Statement::CreateTable(table) => {
            if table.temporary || table.global.is_some() {
                return Err(forbidden("temporary tables are not allowed"));
            }
            if table.like.is_some() || table.clone.is_some() {
                return Err(forbidden(
                    "CREATE TABLE ... LIKE/CLONE copies a table the guard cannot see",
                ));
            }
            if table.partition_of.is_some() || table.inherits.is_some() {
                return Err(forbidden("partitions and inheritance are not allowed"));
            }
            table
                .columns
                .iter()
                .flat_map(|c| &c.options)
                .try_for_each(|o| on_conflict(&o.option))
        }
        Statement::CreateIndex(index) if index.concurrently => Err(forbidden(
            "CREATE INDEX CONCURRENTLY cannot run inside the migration's transaction",
        )),
        Statement::CreateIndex(_) => Ok(()),
        Statement::CreateView(view) => {
            if view.temporary {
                return Err(forbidden("temporary views are not allowed"));
            }
            if view.materialized {
                return Err(forbidden(
                    "materialized views are not allowed (refreshing one is a schema change at run time)",
                ));
            }
            Ok(())
        }
        Statement::AlterTable(alter) => alter.operations.iter().try_for_each(check_alter),
        Statement::Drop {
            object_type: ObjectType::Table | ObjectType::View | ObjectType::Index,
            temporary: false,
            ..
        } => Ok(()),
        Statement::CreateFunction(_)
        | Statement::DropFunction(_)
        | Statement::CreateProcedure { .. }
        | Statement::DropProcedure { .. } => Err(forbidden(
            "functions and procedures are not allowed: code in the database would run outside the statement guard",
        )),
        Statement::CreateTrigger(_) | Statement::DropTrigger(_) => Err(forbidden(
            "triggers are not allowed: a trigger runs later, outside the statement guard",
        )),
        Statement::CreatePolicy(_) | Statement::CreateRule(_) => {
            Err(forbidden("rules and row-level security policies are not allowed"))
        }
        Statement::Set(_) => Err(forbidden("session settings and role changes are not allowed")),
        Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. } => Err(forbidden(
            "transaction control is the host's: each migration runs in one transaction with its record",
        )),
        Statement::CreateExtension(_) => Err(forbidden("extensions are not allowed")),
        Statement::Grant(_) | Statement::Revoke(_) => Err(forbidden("grants are the host's")),
        Statement::Copy { .. } => Err(forbidden("COPY reads and writes server files")),
        Statement::CreateSequence { .. } => Err(forbidden(
            "sequences are not allowed: use an identity column (GENERATED ... AS IDENTITY) or INTEGER PRIMARY KEY",
        )),
        _ => Err(forbidden(
            "only CREATE TABLE / INDEX / VIEW, ALTER TABLE, DROP TABLE / VIEW / INDEX, INSERT, UPDATE, DELETE \
             and SELECT are allowed in a handler's migrations",
        )),
    }
}

/// Regression (an adversarial read, issue 23): a constraint checked only at
/// COMMIT fails the host's COMMIT, after every savepoint of the guest's call
/// succeeded, so the event can be neither applied nor parked by the host's
/// own means. Refused wherever the words stand outside strings and comments.
fn refuse_deferred(backend: Backend, sql: &str) -> Result<(), Refusal> {
    let tokens = Tokenizer::new(dialect(backend), sql)
        .tokenize()
        .map_err(|e| forbidden(format!("cannot read the migration: {e}")))?;
    let deferred = tokens
        .iter()
        .any(|t| matches!(t, Token::Word(w) if matches!(w.keyword, Keyword::DEFERRABLE | Keyword::DEFERRED)));
    if deferred {
        return Err(forbidden(
            "DEFERRABLE and INITIALLY DEFERRED constraints are not allowed: a constraint checked at COMMIT \
             would fail the host's commit instead of the handler's statement",
        ));
    }
    Ok(())
}

/// SQLite's `ON CONFLICT ROLLBACK` on a column would roll back the host's
/// whole transaction, the inbox claim with it, when a handler's insert conflicts.
fn on_conflict(option: &ColumnOption) -> Result<(), Refusal> {
    match option {
        ColumnOption::OnConflict(Keyword::ROLLBACK) => Err(forbidden(
            "ON CONFLICT ROLLBACK would roll back the host's whole transaction: use ABORT, FAIL, IGNORE or REPLACE",
        )),
        _ => Ok(()),
    }
}

fn check_alter(operation: &AlterTableOperation) -> Result<(), Refusal> {
    match operation {
        AlterTableOperation::AddColumn { column_def, .. } => {
            column_def.options.iter().try_for_each(|o| on_conflict(&o.option))
        }
        AlterTableOperation::DropColumn { .. }
        | AlterTableOperation::RenameColumn { .. }
        | AlterTableOperation::RenameTable { .. }
        | AlterTableOperation::AddConstraint { .. }
        | AlterTableOperation::DropConstraint { .. }
        | AlterTableOperation::RenameConstraint { .. }
        | AlterTableOperation::AlterColumn { .. } => Ok(()),
        other => Err(forbidden(format!(
            "ALTER TABLE ... {other} is not allowed (columns, constraints and renames are)"
        ))),
    }
}

/// The ownership half: every table named is the handler's, every new name is free.
fn check_owned(
    statement: &Statement,
    owned: &Owned,
    backend: Backend,
    row_bytes: usize,
) -> Result<(), Refusal> {
    if backend == Backend::Sqlite {
        super::sqlite_work::check_schema(statement, row_bytes)?;
    }
    match statement {
        Statement::Query(_) | Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => {
            check_dml(statement, owned, backend).map(drop)
        }
        Statement::CreateTable(table) => {
            let with_new = owned_with(owned, new_name(owned, &table.name)?);
            for column in &table.columns {
                for option in &column.options {
                    if let ColumnOption::ForeignKey(fk) = &option.option {
                        with_new.check(&fk.foreign_table, "reference")?;
                    }
                }
            }
            for constraint in &table.constraints {
                if let TableConstraint::ForeignKey(fk) = constraint {
                    with_new.check(&fk.foreign_table, "reference")?;
                }
            }
            check_expressions(statement, &with_new, backend).map(drop)
        }
        Statement::CreateIndex(index) => {
            owned.check(&index.table_name, "index")?;
            if let Some(name) = &index.name {
                new_name(owned, name)?;
            }
            check_expressions(statement, owned, backend).map(drop)
        }
        Statement::CreateView(view) => {
            let name = match owned.own_name(&view.name) {
                Some(own) if view.or_replace && owned.tables.contains(&own) => own,
                _ => new_name(owned, &view.name)?,
            };
            check_expressions(statement, &owned_with(owned, name), backend).map(drop)
        }
        Statement::AlterTable(alter) => {
            owned.check(&alter.name, "alter")?;
            for operation in &alter.operations {
                match operation {
                    AlterTableOperation::RenameTable {
                        table_name: RenameTableNameKind::As(to) | RenameTableNameKind::To(to),
                    } => {
                        new_name(owned, to)?;
                    }
                    AlterTableOperation::AddConstraint {
                        constraint: TableConstraint::ForeignKey(fk),
                        ..
                    } => owned.check(&fk.foreign_table, "reference")?,
                    AlterTableOperation::AddColumn { column_def, .. } => {
                        for option in &column_def.options {
                            if let ColumnOption::ForeignKey(fk) = &option.option {
                                owned.check(&fk.foreign_table, "reference")?;
                            }
                        }
                    }
                    _ => {}
                }
            }
            check_expressions(statement, owned, backend).map(drop)
        }
        Statement::Drop {
            object_type, names, ..
        } => {
            for name in names {
                match object_type {
                    // The index's table is judged by the database (the role owns
                    // only its schema; SQLite's authorizer checks the table).
                    ObjectType::Index => {
                        if owned.own_name(name).is_none_or(|n| is_reserved(&n)) {
                            return Err(forbidden(format!(
                                "cannot drop index {name}: it is not in the handler's own schema"
                            )));
                        }
                    }
                    _ => owned.check(name, "drop")?,
                }
            }
            Ok(())
        }
        _ => check_kind(statement),
    }
}

/// A name the migration may give a new table, view or index: in the
/// handler's schema, not kept by the host, not a table function's.
/// The table or view a piece creates, by its name in the handler's schema.
/// (Whether that name is free in SQLite's one namespace is checked against
/// the database when the piece runs: see `db::migrate`.)
pub fn creates(piece: &Piece, owned: &Owned) -> Option<String> {
    match &piece.statement {
        Statement::CreateTable(table) => owned.own_name(&table.name),
        Statement::CreateView(view) => owned.own_name(&view.name),
        _ => None,
    }
}

/// Every name a piece gives a new table, view or index (renames included),
/// in the handler's schema: what a token's `tables` reservation is checked against.
pub fn names_given(piece: &Piece, owned: &Owned) -> Vec<String> {
    match &piece.statement {
        Statement::CreateTable(table) => owned.own_name(&table.name).into_iter().collect(),
        Statement::CreateView(view) => owned.own_name(&view.name).into_iter().collect(),
        Statement::CreateIndex(index) => index
            .name
            .as_ref()
            .and_then(|n| owned.own_name(n))
            .into_iter()
            .collect(),
        Statement::AlterTable(alter) => alter
            .operations
            .iter()
            .filter_map(|operation| match operation {
                AlterTableOperation::RenameTable {
                    table_name: RenameTableNameKind::As(to) | RenameTableNameKind::To(to),
                } => owned.own_name(to),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The tables a piece makes or changes, by their names after it: what the
/// host bounds again right after it runs (`db::migrate::bound_table_in`).
pub fn tables_changed(piece: &Piece, owned: &Owned) -> Vec<String> {
    match &piece.statement {
        Statement::CreateIndex(index) => owned.own_name(&index.table_name).into_iter().collect(),
        Statement::CreateTable(table) => owned.own_name(&table.name).into_iter().collect(),
        Statement::AlterTable(alter) => {
            let renamed = alter.operations.iter().find_map(|operation| match operation {
                AlterTableOperation::RenameTable {
                    table_name: RenameTableNameKind::As(to) | RenameTableNameKind::To(to),
                } => owned.own_name(to),
                _ => None,
            });
            renamed
                .or_else(|| owned.own_name(&alter.name))
                .into_iter()
                .collect()
        }
        _ => Vec::new(),
    }
}

fn new_name(owned: &Owned, name: &ObjectName) -> Result<String, Refusal> {
    let Some(table) = owned.own_name(name) else {
        return Err(forbidden(format!(
            "cannot create {name}: a handler creates objects only in its own schema (leave the name unqualified)"
        )));
    };
    if is_reserved(&table) || TABLE_FUNCTIONS.contains(&table.as_str()) || name_parts(name).len() > 2 {
        return Err(forbidden(format!(
            "cannot create {name}: the name is kept for the host's tables and the databases' own (names \
             starting with {})",
            super::RESERVED_PREFIXES.join(", ")
        )));
    }
    Ok(table)
}

fn owned_with(owned: &Owned, table: String) -> Owned {
    let mut more = owned.clone();
    more.tables.insert(table);
    more
}

#[cfg(test)]
mod tests;
