//! An open transaction on either backend.
//!
//! The pipeline owns it for the whole claim -> guest -> offset -> commit
//! sequence; while a guest runs, it is moved into the guest's store so the
//! guest's statements land in it and in nothing else.

mod deferred;
mod gates;
mod guest;
mod inner;
mod round_trip;
mod stuck;

use super::value::{bind_postgres, bind_sqlite, decode_postgres, decode_sqlite, postgres_row_bytes};
use super::walls::{Connection, WallState, Walls};
use super::{Backend, DbError, PgArray, SqlValue};
use crate::sandbox::postgres::PlainInsert;
use crate::sandbox::sqlite_memory::HARD_HEAP_BYTES;

/// Free space on the database's disk that says a guest statement's
/// `SQLITE_FULL` came from its own temporary files, not a full database disk.
const ROOM_AFTER_SPILL: u64 = 64 << 20;
use deferred::Deferred;
use futures_util::TryStreamExt;
use inner::Bound;
pub(super) use round_trip::HANDLER_ROUND_TRIP;
use round_trip::answered;
use sha2::Digest;
use sqlx::{Postgres, Sqlite, SqliteConnection, Transaction};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;

/// Wraps each guest statement on PostgreSQL, where a failed statement would
/// otherwise abort the whole transaction (SQLite undoes just the statement).
const STATEMENT_SAVEPOINT: &str = "inboxd_statement";

pub struct Tx {
    /// Declared first so it drops first: a transaction dropped with a
    /// handler's walls still up (an error path) takes them down before sqlx
    /// rolls it back on the same connection.
    walls: WallState,
    inner: Inner,
    /// PostgreSQL: wrap each guest statement in a savepoint (the default). Off
    /// for a handler's first run of an event: see [`Tx::set_statement_savepoints`].
    statement_savepoints: bool,
    /// A guest statement failed while `statement_savepoints` was off.
    statement_failed: bool,
    /// PostgreSQL: plain INSERTs of a shared call not sent yet (see `super::deferred`).
    deferred: Option<Deferred>,
    /// The SQLite writer slot this transaction holds, or on PostgreSQL its
    /// handler's transaction permit (`logins::GuestPools`), if any; released
    /// when it ends.
    _writer: Option<OwnedSemaphorePermit>,
    /// PostgreSQL: the host's key to the gates its own writes go through.
    gate: Option<GateKey>,
    /// PostgreSQL: the handler whose own login this transaction's session is
    /// (`Database::begin_guest`); `None` for the host's. A handler's walls go
    /// up only on its own session: on the host's, its SQL would run with the
    /// host's privileges.
    session_of: Option<HandlerSession>,
    /// PostgreSQL handler sessions: how long a host statement's round trip
    /// may go unanswered (see [`round_trip::ROUND_TRIP_GRACE`]); `None`: no bound.
    round_trip: Option<Duration>,
}

/// A transaction on a handler's own PostgreSQL session.
struct HandlerSession {
    handler: String,
    /// Its backend, to stop a statement that outlived every deadline.
    pid: i32,
    /// Where a replacement transaction comes from (see [`Tx::abandon_stuck_call`]).
    pool: sqlx::PgPool,
}

/// The host's key to the `inboxd_gate` functions (see `db::logins`), with the
/// host's own pool to register it through on first use.
#[derive(Clone)]
pub(super) struct GateKey {
    pub key: std::sync::Arc<super::logins::HostKey>,
    pub host: sqlx::PgPool,
}

enum Inner {
    Sqlite(Transaction<'static, Sqlite>),
    /// With how long one round trip may go unanswered (see [`Tx::answer_within`]).
    Postgres(Transaction<'static, Postgres>, Option<Duration>),
}

impl Tx {
    pub(super) fn sqlite(tx: Transaction<'static, Sqlite>) -> Self {
        Self::new(Inner::Sqlite(tx), None)
    }

    pub(super) fn postgres(tx: Transaction<'static, Postgres>, gate: GateKey) -> Self {
        Self::new(Inner::Postgres(tx, None), Some(gate))
    }

    fn new(inner: Inner, gate: Option<GateKey>) -> Self {
        Self {
            walls: WallState::new(),
            inner,
            statement_savepoints: true,
            statement_failed: false,
            deferred: None,
            _writer: None,
            gate,
            session_of: None,
            round_trip: None,
        }
    }

    /// The bound on a round trip of a handler session's transaction: its
    /// `lock_timeout`, plus [`round_trip::ROUND_TRIP_GRACE`], plus `guest` (a guest
    /// statement's own `statement_timeout` while a call's walls are up).
    fn bound_round_trips(&mut self, guest: Duration) {
        if let (Inner::Postgres(_, within), Some(host)) = (&mut self.inner, self.round_trip) {
            *within = Some(host + guest);
        }
    }

    /// Tests: a shorter bound on the host's part of a round trip.
    #[cfg(test)]
    pub(crate) fn bound_host_round_trips_for_test(&mut self, host: Duration) {
        self.round_trip = Some(host);
        self.bound_round_trips(Duration::ZERO);
    }

    /// Marks the transaction's session as `handler`'s own login (PostgreSQL)
    /// and learns its backend (one round trip per transaction).
    pub(super) async fn of_handler(mut self, handler: &str, pool: sqlx::PgPool) -> Result<Self, DbError> {
        self.round_trip = Some(HANDLER_ROUND_TRIP);
        self.bound_round_trips(Duration::ZERO);
        let pid = self.backend_pid().await?;
        self.session_of = Some(HandlerSession {
            handler: handler.to_owned(),
            pid,
            pool,
        });
        Ok(self)
    }

    async fn backend_pid(&mut self) -> Result<i32, DbError> {
        let rows = self.query("SELECT pg_catalog.pg_backend_pid()", &[]).await?;
        let pid = rows.first().and_then(|r| r.first()).and_then(SqlValue::as_i64);
        pid.and_then(|p| i32::try_from(p).ok())
            .ok_or(DbError::TransactionLost)
    }

    /// Refuses to put a handler's walls up on a PostgreSQL session that is
    /// not the handler's own (a defect of the host's, never a guest's doing).
    fn own_session(&self, walls: &Walls) -> Result<(), DbError> {
        let session = self.session_of.as_ref().map(|s| s.handler.as_str());
        if self.backend() == Backend::Postgres && session != Some(walls.handler()) {
            return Err(DbError::NotHandlerSession {
                handler: walls.handler().to_owned(),
            });
        }
        Ok(())
    }

    pub(super) fn holding(mut self, writer: Option<OwnedSemaphorePermit>) -> Self {
        self._writer = writer;
        self
    }

    pub fn backend(&self) -> Backend {
        self.inner.backend()
    }

    /// Runs one of the host's statements and returns the number of rows it
    /// changed. A lingering guest call's walls come down first, so no host
    /// statement ever runs inside them.
    pub async fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        self.send_before_host().await?;
        self.walls.leave_lingering(&mut self.inner).await?;
        self.inner.run(sql, params, true).await
    }

    /// As [`Tx::execute`], for a host statement whose text holds a secret
    /// (a role's password) or names what may soon be gone (a view being
    /// checked): never kept in the connection's statement cache.
    pub(super) async fn execute_uncached(&mut self, sql: &str) -> Result<u64, DbError> {
        self.send_before_host().await?;
        self.walls.leave_lingering(&mut self.inner).await?;
        self.inner.run(sql, &[], false).await
    }

    /// Runs one of the host's statements and returns every row it produced
    /// (outside the walls, as [`Tx::execute`]).
    pub async fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, DbError> {
        self.query_with(sql, params, &[]).await
    }

    /// As [`Tx::query`], with PostgreSQL arrays after `params` (see [`PgArray`]).
    pub(super) async fn query_with(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        arrays: &[PgArray<'_>],
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        self.send_before_host().await?;
        self.walls.leave_lingering(&mut self.inner).await?;
        let unbounded = Bound {
            rows: usize::MAX,
            bytes: usize::MAX,
        };
        self.inner.fetch_with(sql, params, arrays, unbounded, true).await
    }

    /// Savepoint names are the host's constants, never guest input.
    pub async fn savepoint(&mut self, name: &'static str) -> Result<(), DbError> {
        self.execute(&format!("SAVEPOINT {name}"), &[]).await.map(drop)
    }

    pub async fn release(&mut self, name: &'static str) -> Result<(), DbError> {
        self.execute(&format!("RELEASE SAVEPOINT {name}"), &[])
            .await
            .map(drop)
    }

    pub async fn rollback_to(&mut self, name: &'static str) -> Result<(), DbError> {
        self.execute(&format!("ROLLBACK TO SAVEPOINT {name}"), &[])
            .await
            .map(drop)
    }

    /// Holds the host's migration lock until the transaction ends: the
    /// host's own schema, and the roles and grants every handler shares
    /// (PostgreSQL; SQLite serialises writers anyway). Only the host's own
    /// short statements run under it.
    pub async fn lock_migrations(&mut self) -> Result<(), DbError> {
        if self.backend() == Backend::Postgres {
            self.execute(
                "SELECT pg_catalog.pg_advisory_xact_lock($1)",
                &[super::MIGRATION_LOCK_KEY.into()],
            )
            .await?;
        }
        Ok(())
    }

    /// Holds one handler's migration lock until the transaction ends: its
    /// migrations and its row bounds, where its own SQL runs. One handler's
    /// lock never waits for another's (two-key advisory locks are a key space
    /// of their own, apart from [`Tx::lock_migrations`]'s), so a team whose
    /// migrations take their whole time delays only itself.
    pub async fn lock_handler_migrations(&mut self, handler: &str) -> Result<(), DbError> {
        if self.backend() == Backend::Postgres {
            let digest = sha2::Sha256::digest(handler.as_bytes());
            let key = i32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
            self.execute(
                "SELECT pg_catalog.pg_advisory_xact_lock($1::pg_catalog.int4, $2::pg_catalog.int4)",
                &[super::HANDLER_MIGRATION_LOCK_CLASS.into(), key.into()],
            )
            .await?;
        }
        Ok(())
    }

    /// Puts a handler's walls up for its SQL until [`Tx::leave_walls`]: on
    /// PostgreSQL its role, search path and statement timeout, all `LOCAL`;
    /// on SQLite its allowlist and a deadline `statement_timeout` from now.
    pub async fn enter_walls(&mut self, walls: &Walls) -> Result<(), DbError> {
        self.own_session(walls)?;
        self.walls.enter_walls(&mut self.inner, walls).await
    }

    /// Takes the walls of [`Tx::enter_walls`] down; always called after the
    /// handler's SQL, whatever happened.
    pub async fn leave_walls(&mut self) -> Result<(), DbError> {
        self.walls.leave_walls(&mut self.inner).await
    }

    /// Starts a guest call: `SAVEPOINT savepoint`, then the handler's walls
    /// (as [`Tx::enter_walls`]). On PostgreSQL both go in one round trip; the
    /// names spliced in are the host's constants and validated handler names
    /// (`config::is_identifier`), never guest input. Right after a successful
    /// call of the same handler (see [`Tx::exit_guest`]) the walls are still
    /// up, and only the savepoint (and on SQLite the deadline) is renewed.
    pub async fn enter_guest(&mut self, savepoint: &'static str, walls: &Walls) -> Result<(), DbError> {
        self.own_session(walls)?;
        if self
            .deferred
            .as_ref()
            .is_some_and(|d| d.handler != walls.handler())
        {
            self.send_before_host().await?;
        }
        // A guest statement may run its whole `statement_timeout`.
        self.bound_round_trips(walls.statement_timeout());
        self.walls.enter_guest(&mut self.inner, savepoint, walls).await
    }

    /// Consecutive successful guest calls of one handler share one savepoint
    /// (`true`) instead of one each: see `WallState::share_savepoint`. A
    /// failed call then undoes all of them, and [`crate::pipeline`]'s
    /// optimistic batch runs the batch again call by call.
    pub fn share_guest_savepoint(&mut self, share: bool) {
        self.walls.share_savepoint(share);
    }

    pub fn shares_guest_savepoint(&self) -> bool {
        self.walls.shares_savepoint()
    }

    /// Ends a guest call begun with [`Tx::enter_guest`]: keeps its work
    /// (`succeeded`) or undoes it, and leaves the walls. Every guest call ends
    /// here, whatever happened. A failure is undone at once; a success
    /// *lingers* inside its walls until the next host statement or the next
    /// call of the same handler (see `walls::state`).
    pub async fn exit_guest(&mut self, savepoint: &'static str, succeeded: bool) -> Result<(), DbError> {
        if !succeeded {
            // Rolled back with the shared savepoint, as the calls they came from.
            self.deferred = None;
        }
        let exited = self.walls.exit_guest(&mut self.inner, savepoint, succeeded).await;
        self.bound_round_trips(Duration::ZERO);
        exited
    }

    pub async fn commit(mut self) -> Result<(), DbError> {
        // The walls come down before COMMIT, and on SQLite before the
        // connection goes back to the pool.
        self.send_before_host().await?;
        self.walls.before_commit(&mut self.inner).await?;
        match self.inner {
            Inner::Sqlite(tx) => tx.commit().await?,
            Inner::Postgres(tx, within) => answered(within, tx.commit()).await?,
        }
        Ok(())
    }

    pub async fn rollback(mut self) -> Result<(), DbError> {
        // As in `commit`: SQLite's authorizer would refuse the ROLLBACK.
        self.walls.before_rollback();
        match self.inner {
            Inner::Sqlite(tx) => tx.rollback().await?,
            Inner::Postgres(tx, within) => answered(within, tx.rollback()).await?,
        }
        Ok(())
    }
}
