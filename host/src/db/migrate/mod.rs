//! Applying a handler's own SQL migrations.
//!
//! A handler ships a folder of `NNNN_name.sql` files. Each runs once, in
//! version order, in its own transaction together with its record in
//! `handler_migrations`; a file that changed after it was applied is an error,
//! never silently skipped. (The host's tables use sqlx's migrator instead:
//! sqlx keeps one history table per database, which handlers cannot share.)
//!
//! A migration is a team's SQL, so it passes both walls, one statement at a
//! time: the migration guard (`sandbox::migration`: parsed, allowlisted, cut
//! into statements) and then the database's own (the handler's role, or
//! SQLite's allowlist authorizer in migration scope), with a deadline per
//! statement. What a handler owns is derived from the database after each
//! statement: its schema on PostgreSQL; on SQLite the tables its statements
//! created, kept in `handler_tables` (and dropped from it when it drops or
//! renames them, so a name it gave up is not still reachable, while no
//! other handler may take that name: see `ownership`). Its role and login
//! on PostgreSQL are made in `roles`.

use super::columns::texts;
use super::{Backend, Database, DbError, SqlValue, Tx, Walls, handler_role, handler_schema, now_ms};
use crate::sandbox::authorizer::Scope;
use crate::sandbox::guard::Owned;
use crate::sandbox::migration;
use crate::sandbox::nesting::off_worker;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long one run of a handler's migrations may take, all its statements
/// together: an upload's (one transaction), or one migration file of a
/// config file's handler. Generous (an index on a large table takes a
/// while), and bounded in all, not per statement: while it runs it holds the
/// handler's migration lock and, on an upload, the deployments lock every
/// other upload waits for (on SQLite, the only writer). Regression (the
/// adversarial read of session 8): a thousand statements of 59 s each held
/// them for 16 hours.
pub const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a migration that ran out of [`MIGRATION_TIMEOUT`] was stopped.
fn out_of_time() -> String {
    format!(
        "a handler's migrations may run {} s in all (every statement of an upload, or of one \
         migration file, together)",
        MIGRATION_TIMEOUT.as_secs()
    )
}

/// One of a handler's migrations: `NNNN_description.sql` and its SQL.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Migration {
    pub version: i64,
    pub name: String,
    pub sql: String,
}

impl Migration {
    /// Reads a migration from its file name (`NNNN_description.sql`) and text.
    pub fn new(file_name: &str, sql: String) -> Result<Self, DbError> {
        // A name is stored with every version and read back by every
        // version listing: an upload's 100 MB file name was gigabytes per
        // listing (the sixteenth read of issue 23's third round).
        if file_name.len() > MAX_MIGRATION_NAME_BYTES {
            return Err(DbError::HandlerMigration(format!(
                "a migration's file name is {} bytes; at most {MAX_MIGRATION_NAME_BYTES}",
                file_name.len()
            )));
        }
        let stem = file_name.strip_suffix(".sql").unwrap_or(file_name);
        let digits: String = stem.chars().take_while(char::is_ascii_digit).collect();
        let version = digits.parse::<i64>().map_err(|_| {
            DbError::HandlerMigration(format!(
                "migration {file_name} must be named NNNN_description.sql (a version number first)"
            ))
        })?;
        Ok(Self {
            version,
            name: stem.to_owned(),
            sql,
        })
    }
}

/// The longest migration file name, in bytes.
pub const MAX_MIGRATION_NAME_BYTES: usize = 128;

/// Sorts migrations by version, refusing two with the same one.
pub fn in_order(mut migrations: Vec<Migration>) -> Result<Vec<Migration>, DbError> {
    migrations.sort_by_key(|m| m.version);
    if let Some(pair) = migrations.windows(2).find(|w| w[0].version == w[1].version) {
        return Err(DbError::HandlerMigration(format!(
            "migrations {} and {} share version {}",
            pair[0].name, pair[1].name, pair[0].version
        )));
    }
    Ok(migrations)
}

/// The `.sql` files of a migrations folder, in version order.
pub fn read_dir(dir: &Path) -> Result<Vec<Migration>, DbError> {
    let err = |m: String| DbError::HandlerMigration(m);
    let entries = std::fs::read_dir(dir)
        .map_err(|e| err(format!("cannot read migrations folder {}: {e}", dir.display())))?;
    let mut migrations = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| err(e.to_string()))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("sql") {
            continue;
        }
        let file_name = path.file_name().and_then(|s| s.to_str()).unwrap_or_default();
        let sql = std::fs::read_to_string(&path)
            .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
        migrations.push(Migration::new(file_name, sql)?);
    }
    in_order(migrations)
}

/// The schema a handler's qualified names may use.
pub fn own_schema(backend: Backend, handler: &str) -> String {
    match backend {
        Backend::Sqlite => "main".to_owned(),
        Backend::Postgres => handler_schema(handler),
    }
}

/// Applies every migration in `dir` that `handler` has not applied yet, each
/// in its own transaction; returns how many ran.
pub async fn apply_handler(db: &Database, handler: &str, dir: &Path) -> Result<usize, DbError> {
    let mut applied = 0;
    for migration in read_dir(dir)? {
        let mut tx = db.begin_migration(handler).await?;
        if apply_one(&mut tx, handler, &migration).await? {
            applied += 1;
        }
        tx.commit().await?;
    }
    Ok(applied)
}

/// Applies `migration` inside `tx` unless `handler` already has it; `false`:
/// it was already applied. Every statement passes the migration guard and
/// runs inside the handler's walls (see the module docs); a refused or
/// failing statement fails the whole migration, naming the file and the
/// statement, and the caller's transaction undoes everything before it.
/// It may take [`MIGRATION_TIMEOUT`].
pub async fn apply_one(tx: &mut Tx, handler: &str, migration: &Migration) -> Result<bool, DbError> {
    apply_within(tx, handler, migration, Instant::now() + MIGRATION_TIMEOUT).await
}

/// As [`apply_one`], as one of several migrations that must all end by `deadline`.
pub async fn apply_within(
    tx: &mut Tx,
    handler: &str,
    migration: &Migration,
    deadline: Instant,
) -> Result<bool, DbError> {
    apply_one_reserving(tx, handler, migration, &|_| None, deadline).await
}

/// As [`apply_within`], refusing on SQLite every name `reserved` says another
/// token holds (`[[admin.tokens]] tables`; it returns that token's name).
pub async fn apply_one_reserving(
    tx: &mut Tx,
    handler: &str,
    migration: &Migration,
    reserved: &(dyn Fn(&str) -> Option<String> + Sync),
    deadline: Instant,
) -> Result<bool, DbError> {
    // Also before a migration with nothing to run: empty files cost a few
    // statements each, and the writer is held meanwhile.
    if Instant::now() >= deadline {
        return Err(DbError::HandlerMigration(format!(
            "migration {} of handler {handler} was not started: {}",
            migration.name,
            out_of_time()
        )));
    }
    let checksum = format!("{:x}", Sha256::digest(migration.sql.as_bytes()));
    tx.lock_handler_migrations(handler).await?;
    if let Some(recorded) = recorded_checksum(tx, handler, migration.version).await? {
        if recorded != checksum {
            return Err(DbError::HandlerMigration(format!(
                "migration {} of handler {handler} changed after it was applied; add a new migration instead",
                migration.name
            )));
        }
        return Ok(false);
    }
    let file = format!("{}.sql", migration.name);
    let (backend, sql) = (tx.backend(), migration.sql.clone());
    // Shared with the checks' blocking threads, not copied: a statement's
    // tree is as deep as the guard allows, and copying it is a recursion.
    let pieces = off_worker(move || migration::split(backend, &sql))
        .await
        .map(std::sync::Arc::new)
        .map_err(|refusal| {
            DbError::HandlerMigration(format!(
                "migration {file} of handler {handler} is refused: {refusal}"
            ))
        })?;
    let schema = own_schema(tx.backend(), handler);
    let mut own = own_tables_in(tx, handler).await?;
    // SQLite: the longest row the handler's tables may hold already (see
    // `row_bound::sqlite_row_bound`), which its statements are counted at.
    let stored = match tx.backend() {
        Backend::Sqlite => row_bound::sqlite_recorded_in(tx, handler).await?.unwrap_or(0) as usize,
        Backend::Postgres => 0,
    };
    for index in 0..pieces.len() {
        let piece = &pieces[index];
        let owned = Owned::new(&schema, &own);
        let refused = |why: String| {
            DbError::HandlerMigration(format!("migration {file} of handler {handler} is refused: {why}"))
        };
        let (all, checked_owned) = (pieces.clone(), owned.clone());
        off_worker(move || migration::check_at(&all[index], &checked_owned, stored))
            .await
            .map_err(|refusal| refused(refusal.to_string()))?;
        if tx.backend() == Backend::Postgres {
            // Counted again at the handler's own row bound, with what its
            // tables' own expressions add to a write (see `sandbox::work`).
            let bound = row_bound::handler_bound_in(tx, handler).await?;
            let catalog = crate::sandbox::postgres::Catalog {
                hidden: row_bound::hidden_work_in(tx, handler, bound as usize).await?,
                row_functions: Some(row_functions::row_functions_in(tx).await?),
            };
            let text = piece.text.clone();
            off_worker(move || {
                crate::sandbox::nesting::on_guard_stack(|| {
                    crate::sandbox::postgres::check(
                        &text,
                        crate::sandbox::postgres::Mode::Migration,
                        bound,
                        &catalog,
                    )
                })
            })
            .await
            .map_err(|refusal| refused(refusal.to_string()))?;
        }
        if tx.backend() == Backend::Sqlite {
            for name in migration::names_given(piece, &owned) {
                if let Some(token) = reserved(&name) {
                    return Err(refused(format!(
                        "cannot create {name}: the operator reserved that name for token {token:?}'s handlers \
                         (`[[admin.tokens]] tables`; on SQLite every handler's tables share one namespace)"
                    )));
                }
            }
        }
        let before = sqlite_tables(tx).await?;
        // SQLite has one namespace: a name another handler holds is not free,
        // even with IF NOT EXISTS (which would do nothing, yet have SQLite
        // treat the name as the table being created: see sandbox::authorizer).
        if let Some(name) = migration::creates(piece, &owned)
            && before.iter().any(|t| t.eq_ignore_ascii_case(&name))
            && !own.iter().any(|t| t.eq_ignore_ascii_case(&name))
        {
            return Err(refused(format!(
                "cannot create {name}: another handler's table or view has that name"
            )));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(DbError::HandlerMigration(format!(
                "migration {file} of handler {handler} was stopped before `{}`: {}",
                short(&piece.text),
                out_of_time()
            )));
        }
        let walls = Walls::new(handler, Scope::Migration, &own, left.min(MIGRATION_TIMEOUT));
        tx.enter_walls(&walls).await?;
        // A failed statement is returned as is: on PostgreSQL the transaction
        // is aborted and will be rolled back whole (its LOCAL settings with it);
        // on SQLite dropping it takes the walls down.
        tx.migration_execute(&piece.text).await.map_err(|e| {
            let e = match e {
                DbError::StatementTimeout => format!("it was cancelled: {}", out_of_time()),
                other => other.to_string(),
            };
            DbError::HandlerMigration(format!(
                "migration {file} of handler {handler} failed at `{}`: {e}",
                short(&piece.text)
            ))
        })?;
        tx.leave_walls().await?;
        if tx.backend() == Backend::Postgres {
            let after = |e: String| {
                DbError::HandlerMigration(format!(
                    "migration {file} of handler {handler} is refused: after `{}`, {e}",
                    short(&piece.text)
                ))
            };
            if let Some(view) = row_bound::check_option_view_in(tx, handler).await? {
                return Err(after(format!(
                    "view {view} has a CHECK OPTION, whose condition would run on every row written \
                     through it where the statement guard cannot count it: leave the option out"
                )));
            }
            if let Some(name) = row_bound::type_named_relation_in(tx, handler).await? {
                return Err(after(format!(
                    "{name} is the name of a type a cast may name (one of PostgreSQL's own types, or one \
                     the statement guard lets a cast name), which a table or view of that name would shadow \
                     for this handler's SQL: choose another name"
                )));
            }
            let changed = migration::tables_changed(piece, &owned);
            for table in &changed {
                row_bound::bound_table_in(tx, handler, table)
                    .await
                    .map_err(|e| after(e.to_string()))?;
            }
            // A foreign key's ON DELETE / ON UPDATE action writes to a table
            // no statement names, so each table's own expressions must fit
            // the bound by themselves.
            if !changed.is_empty() {
                if let Some(column) = row_bound::refused_type_column_in(tx, handler).await? {
                    return Err(after(column.to_string()));
                }
                if let Some(column) = row_bound::bare_numeric_in(tx, handler).await? {
                    return Err(after(format!(
                        "column {column} is a numeric without a precision, or with a scale below 0 or \
                         above its precision: cast it, as in `CAST(x AS numeric(12, 2))` (a bare numeric \
                         holds up to 147,455 digits, whose arithmetic PostgreSQL does not interrupt)"
                    )));
                }
                let bound = row_bound::handler_bound_in(tx, handler).await?;
                let hidden = row_bound::hidden_work_in(tx, handler, bound as usize).await?;
                let over = hidden
                    .iter()
                    .find(|(_, ns)| **ns > crate::sandbox::work::ROW_WORK_NS);
                if let Some((table, ns)) = over {
                    return Err(after(format!(
                        "the CHECK, DEFAULT, generated and index expressions of table {table} may work up to \
                         {} ms on each row written to it, which PostgreSQL does not interrupt (the bound is \
                         {} ms, counting every column at limits.max_row_bytes)",
                        ns / 1_000_000,
                        crate::sandbox::work::ROW_WORK_NS / 1_000_000
                    )));
                }
            }
        }
        own = record_tables(tx, handler, &own, &before).await?;
        // Before the next statement: an index it made may be analyzed as
        // soon as this commits.
        statistics::skip_expressions_in(tx, handler).await?;
        if let Some(reference) = view_of_views(tx, handler, &own).await? {
            return Err(DbError::HandlerMigration(format!(
                "migration {file} of handler {handler} is refused: after `{}`, {reference}",
                short(&piece.text)
            )));
        }
        if let Some(broken) = catalog_rules::bound_broken(tx, handler).await? {
            return Err(DbError::HandlerMigration(format!(
                "migration {file} of handler {handler} is refused: after `{}`, {broken}",
                short(&piece.text)
            )));
        }
        // (Not after a DROP: a migration that drops indexes to come back
        // within the bound must be able to run.)
        let drops = matches!(piece.statement, sqlparser::ast::Statement::Drop { .. });
        if !drops && let Some(over) = catalog_rules::sqlite_schema_over(tx, &own).await? {
            return Err(DbError::HandlerMigration(format!(
                "migration {file} of handler {handler} is refused: after `{}`, {over}",
                short(&piece.text)
            )));
        }
        if let Some(stored) = catalog_rules::sqlite_stored_schema(tx, &own).await? {
            return Err(DbError::HandlerMigration(format!(
                "migration {file} of handler {handler} is refused: after `{}`, {stored}",
                short(&piece.text)
            )));
        }
        if let Some(reference) = foreign_reference(tx, &own).await? {
            return Err(DbError::HandlerMigration(format!(
                "migration {file} of handler {handler} is refused: after `{}`, {reference}",
                short(&piece.text)
            )));
        }
    }
    if tx.backend() == Backend::Sqlite {
        // Its statements wrote rows of up to the migration walls' length.
        row_bound::sqlite_raise_in(tx, handler, crate::config::defaults::MAX_ROW_BYTES as u64).await?;
    }
    let record = [
        handler.into(),
        migration.version.into(),
        migration.name.as_str().into(),
        checksum.into(),
        now_ms().into(),
    ];
    tx.host_write(
        "INSERT INTO handler_migrations (handler, version, name, checksum, applied_at) VALUES ($1, $2, $3, $4, $5)",
        "SELECT inboxd_gate.record_migration($1, $2, $3, $4, $5, $6)",
        &record,
    )
    .await?;
    tracing::info!(handler, migration = %migration.name, "applied handler migration");
    Ok(true)
}

/// The checksum recorded for a migration the handler already applied.
async fn recorded_checksum(tx: &mut Tx, handler: &str, version: i64) -> Result<Option<String>, DbError> {
    let params = [handler.into(), version.into()];
    let rows = tx
        .host_rows(
            "SELECT checksum FROM handler_migrations WHERE handler = $1 AND version = $2",
            "SELECT inboxd_gate.migration_checksum($1, $2, $3)",
            &params,
        )
        .await?;
    Ok(rows
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next())
        .and_then(|v| v.as_str().map(str::to_owned)))
}

fn short(text: &str) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(160) {
        Some((cut, _)) => format!("{}...", &one_line[..cut]),
        None => one_line,
    }
}

mod catalog_rules;
mod ownership;
mod roles;
pub mod row_bound;
mod row_functions;
mod statistics;
pub use catalog_rules::sqlite_table_calls;
pub(crate) use catalog_rules::{
    MAX_COLUMNS, MAX_FOREIGN_KEYS, MAX_STORED_EXPRESSION_BYTES, POSTGRES_FOREIGN_KEYS,
    POSTGRES_STORED_EXPRESSION_BYTES, POSTGRES_VIEWS_OF_VIEWS, POSTGRES_WIDE_RELATIONS,
};
use catalog_rules::{foreign_reference, view_of_views};
pub use ownership::own_tables;
use ownership::{own_tables_in, record_tables, sqlite_tables};
pub use roles::{prepare_handler, renew_login};
pub use row_bound::{CONSTRAINT as ROW_BOUND, RefusedColumn, bound_rows, hidden_work, refused_type_column};
pub use row_functions::row_functions;

/// SQLite: what makes the handler's schema too large to load (see
/// `catalog_rules::MAX_INDEXES_PER_TABLE`), or a view of its that reads what
/// it does not own or what does not exist, if anything: a database an older
/// release migrated may hold it.
pub async fn sqlite_schema_over(db: &Database, own: &[String]) -> Result<Option<String>, DbError> {
    if db.backend() != Backend::Sqlite {
        return Ok(None);
    }
    let mut tx = db.begin().await?;
    let mut over = catalog_rules::sqlite_schema_over(&mut tx, own)
        .await?
        .map(|over| format!("{over} (a migration may drop indexes)"));
    if over.is_none() {
        over = catalog_rules::sqlite_own_views(&mut tx, own)
            .await?
            .map(|views| format!("{views} (a migration may drop or change the view)"));
    }
    if over.is_none() {
        over = catalog_rules::sqlite_stored_schema(&mut tx, own).await?;
    }
    tx.commit().await?;
    Ok(over)
}
pub(crate) use statistics::POSTGRES_PARTIAL_INDEXES;

#[cfg(test)]
mod catalog_tests;
#[cfg(test)]
mod sqlite_schema_tests;
#[cfg(test)]
mod tests;
