//! The walls' state machine on one open transaction: whether a handler's
//! walls are up, for which call, and what the host sends to take them down.
//!
//! [`Tx`](crate::db::Tx) owns one [`WallState`] and calls into it for
//! everything walls-related; this module never sends a guest's text, only the
//! host's own statements (savepoint names are host constants, handler names
//! validated identifiers). Nothing else switches SQLite's authorizer
//! ([`switch`]) or composes PostgreSQL's [`PG_LEAVE`].
//!
//! ```text
//! Outside --enter_guest--> InCall
//! InCall --exit_guest(ok)--> Lingering            (no statement: walls up, savepoint open)
//! InCall --exit_guest(failed)--> Outside          (rolled back to the savepoint, walls down)
//! Lingering --enter_guest(same handler and savepoint)--> InCall   (savepoint renewed,
//!     or kept as it is when the savepoint is shared: see `share_savepoint`)
//! Lingering --host statement, enter_walls, another call, commit--> Outside   (work kept)
//! any --SQLite rolled the transaction back--> lost: a new one begun, Lingering
//!     forgotten, InCall stays walled (its deadline has passed) until exit_guest
//! commit, rollback, drop: SQLite's authorizer down before the connection goes back to the pool
//! ```
//! A migration's walls ([`WallState::enter_walls`], [`WallState::leave_walls`])
//! are put up and taken down by its caller around each statement, outside this
//! cycle.

use super::{PG_LEAVE, SqliteSwitch, Walls, switch};
use crate::db::{Backend, DbError};
use crate::sandbox::authorizer::ConnectionWalls;
use crate::sandbox::guard::Ctes;
use sqlx::SqliteConnection;
use std::time::Instant;

/// What the walls need of the transaction they stand on. Every text sent
/// through it is the host's own.
pub(in crate::db) trait Connection {
    fn backend(&self) -> Backend;
    /// One host statement without parameters, prepared and cached.
    async fn statement(&mut self, sql: &str) -> Result<(), DbError>;
    /// Several host statements in one round trip (simple query protocol).
    async fn statements(&mut self, sql: &str) -> Result<(), DbError>;
    /// The SQLite connection under the transaction; `None` on PostgreSQL.
    fn sqlite(&mut self) -> Option<&mut SqliteConnection>;
}

enum Phase {
    /// No guest call's walls are up (a migration statement's may be).
    Outside,
    /// Between `enter_guest` and `exit_guest`: these walls are up.
    InCall(Walls),
    /// A successful call whose walls are still up and whose savepoint is
    /// still open (see [`WallState::exit_guest`]).
    Lingering { savepoint: &'static str, walls: Walls },
}

/// One transaction's walls.
pub(in crate::db) struct WallState {
    /// Declared first so it drops first (see [`SqliteSwitch`]).
    sqlite: SqliteSwitch,
    call: Phase,
    /// SQLite rolled the whole transaction back under a guest's statement
    /// (see [`WallState::take_lost`]); a new, empty one was begun in its place.
    lost: bool,
    /// Consecutive successful calls of one handler share one savepoint (see
    /// [`WallState::share_savepoint`]).
    share: bool,
}

impl WallState {
    pub fn new() -> Self {
        Self {
            sqlite: SqliteSwitch::default(),
            call: Phase::Outside,
            lost: false,
            share: false,
        }
    }

    /// With `true`, a call that follows a successful call of the same
    /// handler keeps that call's savepoint instead of renewing it (on SQLite
    /// only the deadline is renewed): no statement at all between the two.
    /// A failure then undoes every call since the savepoint was taken, so
    /// whoever turns this on must treat any failed call as undoing all of
    /// them (the pipeline's optimistic batch runs the batch again without it).
    pub fn share_savepoint(&mut self, share: bool) {
        self.share = share;
    }

    pub fn shares_savepoint(&self) -> bool {
        self.share
    }

    /// The handler whose call is running, if one is.
    /// The `statement_timeout` of the walls up now (a call's, running or
    /// lingering), if any: what a statement sent inside them may run.
    pub fn statement_timeout_up(&self) -> Option<std::time::Duration> {
        match &self.call {
            Phase::InCall(walls) | Phase::Lingering { walls, .. } => Some(walls.statement_timeout()),
            _ => None,
        }
    }

    pub fn handler_in_call(&self) -> Option<&str> {
        match &self.call {
            Phase::InCall(walls) => Some(walls.handler()),
            _ => None,
        }
    }

    /// Puts a handler's walls up for its SQL until [`WallState::leave_walls`]: on
    /// PostgreSQL its role, search path and statement timeout, all `LOCAL`;
    /// on SQLite its allowlist and a deadline `statement_timeout` from now.
    pub async fn enter_walls<C: Connection>(&mut self, conn: &mut C, walls: &Walls) -> Result<(), DbError> {
        self.leave_lingering(conn).await?;
        self.put_up(conn, walls).await
    }

    async fn put_up<C: Connection>(&mut self, conn: &mut C, walls: &Walls) -> Result<(), DbError> {
        match conn.backend() {
            Backend::Postgres => conn.statements(&walls.pg_enter()).await,
            Backend::Sqlite => {
                let connection = self.sqlite.find(conn).await?;
                // The deadline counts from now, after the (first) trip to find the walls.
                switch(
                    connection,
                    Some((walls.policy(), Instant::now() + walls.statement_timeout())),
                );
                Ok(())
            }
        }
    }

    /// Takes the walls of [`WallState::enter_walls`] down; always called after
    /// the handler's SQL, whatever happened.
    pub async fn leave_walls<C: Connection>(&mut self, conn: &mut C) -> Result<(), DbError> {
        match conn.backend() {
            Backend::Postgres => conn.statements(PG_LEAVE).await,
            Backend::Sqlite => {
                self.sqlite.down();
                Ok(())
            }
        }
    }

    /// Starts a guest call: `SAVEPOINT savepoint`, then the handler's walls.
    /// On PostgreSQL both go in one round trip. Right after a successful call
    /// of the same handler under the same savepoint (see
    /// [`WallState::exit_guest`]) the walls are still up, and only the
    /// savepoint (and on SQLite the deadline) is renewed; after any other
    /// lingering call, that call's walls come down first, keeping its work.
    pub async fn enter_guest<C: Connection>(
        &mut self,
        conn: &mut C,
        savepoint: &'static str,
        walls: &Walls,
    ) -> Result<(), DbError> {
        // Taken out: whatever fails below, no call is left lingering.
        match std::mem::replace(&mut self.call, Phase::Outside) {
            Phase::Lingering {
                savepoint: open,
                walls: up,
            } if open == savepoint && up.handler() == walls.handler() => {
                if self.share {
                    if conn.backend() == Backend::Sqlite {
                        // The deadline is the new call's own.
                        self.put_up(conn, walls).await?;
                    }
                } else {
                    self.renew_savepoint(conn, savepoint, walls).await?;
                }
                self.call = Phase::InCall(walls.clone());
                return Ok(());
            }
            lingering @ Phase::Lingering { .. } => {
                self.call = lingering;
                self.leave_lingering(conn).await?;
            }
            other => self.call = other,
        }
        match conn.backend() {
            Backend::Postgres => {
                let sql = format!("SAVEPOINT {savepoint}; {}", walls.pg_enter());
                conn.statements(&sql).await?;
            }
            Backend::Sqlite => {
                // The savepoint first: the authorizer refuses it inside the walls.
                conn.statement(&format!("SAVEPOINT {savepoint}")).await?;
                self.put_up(conn, walls).await?;
            }
        }
        self.call = Phase::InCall(walls.clone());
        Ok(())
    }

    /// Ends a guest call begun with [`WallState::enter_guest`]: keeps its work
    /// (`succeeded`) or undoes it, and leaves the walls. Every guest call ends
    /// here, whatever happened; without a call running it does nothing.
    ///
    /// A failure is undone at once and the walls come down (on SQLite the
    /// authorizer first: it would refuse the host's own savepoint statement). A success
    /// only *lingers*: the walls stay up and the savepoint open until the
    /// next statement of the host's own (which leaves them first, see
    /// [`WallState::leave_lingering`]) or the next call of the same handler (which
    /// just releases the savepoint and takes a new one). In a batch of
    /// events that saves a round trip per event, and no host statement ever
    /// runs inside the walls.
    pub async fn exit_guest<C: Connection>(
        &mut self,
        conn: &mut C,
        savepoint: &'static str,
        succeeded: bool,
    ) -> Result<(), DbError> {
        if !matches!(self.call, Phase::InCall(_)) {
            return Ok(());
        }
        let Phase::InCall(walls) = std::mem::replace(&mut self.call, Phase::Outside) else {
            unreachable!("matched above");
        };
        if self.lost {
            // The savepoint went with the transaction SQLite rolled back.
            return self.leave_walls(conn).await;
        }
        if succeeded {
            self.call = Phase::Lingering { savepoint, walls };
            return Ok(());
        }
        match conn.backend() {
            // The walls are left explicitly, not by the rollback: after a
            // renewed savepoint they were put up before it, and a rollback to
            // it would leave them standing. And left after the rollback, which
            // would otherwise undo the leaving.
            Backend::Postgres => {
                conn.statements(&format!("ROLLBACK TO SAVEPOINT {savepoint}; {PG_LEAVE}"))
                    .await
            }
            Backend::Sqlite => {
                self.leave_walls(conn).await?;
                conn.statement(&format!("ROLLBACK TO SAVEPOINT {savepoint}"))
                    .await
            }
        }
    }

    /// Between two successful calls of one handler: keep the first one's work
    /// and open a savepoint for the next, inside the same walls.
    async fn renew_savepoint<C: Connection>(
        &mut self,
        conn: &mut C,
        savepoint: &'static str,
        walls: &Walls,
    ) -> Result<(), DbError> {
        let sql = format!("RELEASE SAVEPOINT {savepoint}; SAVEPOINT {savepoint}");
        match conn.backend() {
            Backend::Postgres => conn.statements(&sql).await,
            Backend::Sqlite => {
                // The authorizer would refuse the savepoint statements.
                self.leave_walls(conn).await?;
                conn.statements(&sql).await?;
                self.put_up(conn, walls).await
            }
        }
    }

    /// Leaves the walls of a successful guest call that is still lingering,
    /// keeping its work. Every host statement calls this first.
    pub async fn leave_lingering<C: Connection>(&mut self, conn: &mut C) -> Result<(), DbError> {
        let Phase::Lingering { savepoint, .. } = self.call else {
            return Ok(());
        };
        self.call = Phase::Outside;
        match conn.backend() {
            Backend::Postgres => {
                conn.statements(&format!("{PG_LEAVE}; RELEASE SAVEPOINT {savepoint}"))
                    .await
            }
            Backend::Sqlite => {
                self.leave_walls(conn).await?;
                conn.statements(&format!("RELEASE SAVEPOINT {savepoint}")).await
            }
        }
    }

    /// After a statement failed: true if SQLite stopped it at the deadline.
    /// If SQLite took the whole transaction with it (an interrupted write
    /// does), a new one is begun in its place (see [`WallState::take_lost`]).
    pub async fn after_failure<C: Connection>(&mut self, conn: &mut C) -> Result<bool, DbError> {
        let Some(connection) = self.sqlite.0 else {
            return Ok(false);
        };
        // Read before a restart, which puts the walls (and the flag) up anew.
        let interrupted = connection.take_interrupted();
        if !connection.in_transaction() {
            self.restart_lost(conn, connection).await?;
        }
        Ok(interrupted)
    }

    /// Begins a new transaction in place of one SQLite rolled back, so the
    /// connection and sqlx agree again; the savepoints died with the old one.
    async fn restart_lost<C: Connection>(
        &mut self,
        conn: &mut C,
        connection: &'static ConnectionWalls,
    ) -> Result<(), DbError> {
        self.lost = true;
        if let Phase::Lingering { .. } = self.call {
            self.call = Phase::Outside;
        }
        // Down for the host's BEGIN, which the authorizer would refuse.
        switch(connection, None);
        let begun = conn.statements("BEGIN IMMEDIATE").await;
        if let Phase::InCall(walls) = &self.call {
            // The rest of the call stays inside the walls (its deadline has
            // passed), whether or not the new transaction could begin.
            switch(connection, Some((walls.policy(), Instant::now())));
        }
        // Without a transaction this connection is of no use to the event:
        // the host's to retry, never the guest's to go on with.
        begun.map_err(|_| DbError::TransactionLost)
    }

    /// The transaction was replaced by a new, empty one under a guest's call
    /// (PostgreSQL: see `Tx::abandon_stuck_call`): the savepoints died with
    /// it, the call does not linger, and the host is told once.
    pub fn mark_lost(&mut self) {
        self.lost = true;
        if let Phase::Lingering { .. } = self.call {
            self.call = Phase::Outside;
        }
    }

    /// True (once) if SQLite rolled back the whole transaction under a
    /// guest's statement: everything before it in this transaction is gone
    /// (claims, earlier events of the batch, savepoints) and the transaction
    /// is a new, empty one. The caller must redo that work without the guest.
    pub fn take_lost(&mut self) -> bool {
        std::mem::take(&mut self.lost)
    }

    /// As [`WallState::take_lost`], without clearing it.
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// SQLite: whether the main database's disk has `bytes` free (see
    /// `ConnectionWalls::database_has_room`); true on PostgreSQL.
    pub fn database_has_room(&self, bytes: u64) -> bool {
        self.sqlite
            .0
            .is_none_or(|connection| connection.database_has_room(bytes))
    }

    /// SQLite: stops the statement running on the connection, if one is.
    pub fn interrupt_sqlite(&self) {
        if let Some(connection) = self.sqlite.0 {
            connection.interrupt();
        }
    }

    /// The CTE names of the guest statement about to run (SQLite's authorizer
    /// sees a CTE's reads under its name).
    pub fn set_ctes(&self, ctes: Ctes) {
        if let Some(connection) = self.sqlite.0 {
            connection.set_ctes(ctes);
        }
    }

    /// Before COMMIT: a call still lingering in its walls has its savepoint
    /// released and the walls come down (SQLite's authorizer would refuse the
    /// COMMIT); then as [`WallState::before_rollback`].
    pub async fn before_commit<C: Connection>(&mut self, conn: &mut C) -> Result<(), DbError> {
        self.leave_lingering(conn).await?;
        self.before_rollback();
        Ok(())
    }

    /// SQLite's walls down now, not when the transaction drops after its
    /// connection went back to the pool (where another transaction may have
    /// put up its own). PostgreSQL's are `LOCAL` and end with the transaction.
    pub fn before_rollback(&mut self) {
        if let Some(connection) = self.sqlite.0.take() {
            switch(connection, None);
        }
    }
}
