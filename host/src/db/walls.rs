//! A handler's walls on an open transaction: what its SQL may touch, as whom,
//! and for how long each statement may run.
//!
//! PostgreSQL: the handler's role (it owns only the handler's schema and has
//! no privilege on the host's), its schema first on the search path with
//! `pg_catalog` and then `pg_temp` after it (a temporary table can never
//! shadow a name), and `statement_timeout`, all `LOCAL` to the transaction.
//! SQLite: the allowlist authorizer and the progress-handler deadline of
//! `sandbox::authorizer`. What a guest sends can never take these down: the
//! statement guard refuses every statement that could (SET, RESET, DO,
//! set_config, transaction control) and no code a handler could plant
//! (functions, triggers, rules) is allowed to exist. Leaving the walls is the
//! host's own statement, sent only after the guest's call has returned.

use super::{Database, DbError, handler_role, handler_schema, migrate};
use crate::sandbox::authorizer::{Policy, Scope};
use std::sync::Arc;
use std::time::Duration;

/// The search path of the host's own statements: the host schema, then the
/// catalog, then (explicitly last, so it never shadows a host table)
/// `pg_temp`. Unqualified host SQL is then the same text on both backends.
pub const HOST_SEARCH_PATH: &str = "inboxd,pg_catalog,pg_temp";

/// Leaves a handler's walls on PostgreSQL, back to the host's settings.
/// `SET LOCAL ... TO DEFAULT` restores the connection's own statement timeout.
/// Qualified: it runs while the handler's schema is still first on the path.
pub(super) const PG_LEAVE: &str = "SELECT pg_catalog.set_config('role', 'none', true), \
     pg_catalog.set_config('search_path', 'inboxd,pg_catalog,pg_temp', true); SET LOCAL statement_timeout TO DEFAULT";

/// One handler's walls, built once per loaded version (or per migration statement).
#[derive(Debug, Clone)]
pub struct Walls {
    handler: String,
    policy: Arc<Policy>,
    statement_timeout: Duration,
}

impl Walls {
    /// `own_tables`: the tables the handler's migrations created (SQLite's
    /// allowlist; on PostgreSQL its schema says it). `statement_timeout`:
    /// how long one statement may run before the database cancels it.
    pub fn new(handler: &str, scope: Scope, own_tables: &[String], statement_timeout: Duration) -> Self {
        Self {
            handler: handler.to_owned(),
            policy: Arc::new(Policy::new(scope, own_tables)),
            statement_timeout,
        }
    }

    /// A handler's run-time walls, with the tables it owns now.
    pub async fn load(db: &Database, handler: &str, statement_timeout: Duration) -> Result<Self, DbError> {
        let own = migrate::own_tables(db, handler).await?;
        Ok(Self::new(handler, Scope::Guest, &own, statement_timeout))
    }

    pub fn handler(&self) -> &str {
        &self.handler
    }

    pub fn statement_timeout(&self) -> Duration {
        self.statement_timeout
    }

    pub(super) fn policy(&self) -> Arc<Policy> {
        self.policy.clone()
    }

    /// PostgreSQL: puts the walls up. The names are validated handler names
    /// (`config::is_identifier`), never guest input.
    pub(super) fn pg_enter(&self) -> String {
        // statement_timeout 0 would mean "no limit": at least 1 ms.
        let ms = self.statement_timeout.as_millis().max(1);
        format!(
            "SELECT set_config('search_path', '{},pg_catalog,pg_temp', true), set_config('role', '{}', true), \
             set_config('statement_timeout', '{ms}', true)",
            handler_schema(&self.handler),
            handler_role(&self.handler),
        )
    }
}
