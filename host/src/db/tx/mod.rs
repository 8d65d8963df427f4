//! An open transaction on either backend.
//!
//! The pipeline owns it for the whole claim -> guest -> offset -> commit
//! sequence; while a guest runs, it is moved into the guest's store so the
//! guest's statements land in it and in nothing else.

mod deferred;
mod gates;
mod round_trip;
mod stuck;

use super::value::{bind_postgres, bind_sqlite, decode_postgres, decode_sqlite};
use super::walls::{Connection, WallState, Walls};
use super::{Backend, DbError, PgArray, SqlValue};
use crate::sandbox::postgres::PlainInsert;
use crate::sandbox::sqlite_memory::HARD_HEAP_BYTES;

/// Free space on the database's disk that says a guest statement's
/// `SQLITE_FULL` came from its own temporary files, not a full database disk.
const ROOM_AFTER_SPILL: u64 = 64 << 20;
use deferred::Deferred;
use futures_util::TryStreamExt;
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
    /// The SQLite writer slot this transaction holds, if any; released when it ends.
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

    /// Runs a guest's statement, inside the walls [`Tx::enter_guest`] put up.
    /// On SQLite never from the statement cache, because the authorizer (the
    /// second wall) judges a statement when it is prepared. On PostgreSQL it
    /// is prepared once per connection and cached: privileges are checked at
    /// every execution and a plan is re-made when the search path (the
    /// handler's schema) differs. On PostgreSQL it runs inside a savepoint, so
    /// a failure leaves the transaction usable, as it does on SQLite. A
    /// statement still running at the walls' deadline is cancelled by the
    /// database ([`DbError::StatementTimeout`]).
    pub async fn guest_execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        self.guest_execute_approved(sql, params, None, true).await
    }

    /// As [`Tx::guest_execute`], with what the guard found: `insert`, the
    /// statement is a plain one-row INSERT, which a shared call holds back
    /// and sends with the next ones of the same text (see `super::deferred`):
    /// its one row is its effect. `keep`: PostgreSQL may keep it prepared on
    /// the session (`sandbox::postgres::plan_cache`); otherwise it is
    /// PostgreSQL's unnamed statement, whose plan the next one frees.
    pub async fn guest_execute_approved(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        insert: Option<&Arc<PlainInsert>>,
        keep: bool,
    ) -> Result<u64, DbError> {
        self.refuse_after_loss()?;
        let insert = insert.filter(|insert| Deferred::fits(insert, params));
        if let (Some(insert), Some(handler)) = (insert, self.defers()) {
            let joins = self.deferred.as_ref().is_some_and(|d| d.takes(&handler, sql));
            if !joins {
                self.send_in_call().await?;
                self.deferred = Some(Deferred::new(&handler, sql, insert.clone()));
            }
            let deferred = self.deferred.as_mut().expect("set above");
            deferred.push(params);
            if deferred.full() {
                self.send_in_call().await?;
            }
            return Ok(1);
        }
        self.send_in_call().await?;
        let text = self.guest_text(sql, params);
        let sql = &*text;
        if self.optimistic()? {
            let result = self.inner.run(sql, params, keep).await;
            let result = self.deadline_error(result).await;
            self.statement_failed = result.is_err();
            return result;
        }
        self.statement_savepoint().await?;
        let result = self
            .inner
            .run(sql, params, keep && self.caches_guest_statements())
            .await;
        let result = self.deadline_error(result).await;
        self.end_statement_savepoint(result.is_ok()).await?;
        result
    }

    /// As [`Tx::guest_execute`], returning rows; more than `max_rows` rows is
    /// [`DbError::TooManyRows`], more than `max_bytes` of values [`DbError::ResultTooLarge`].
    pub async fn guest_query(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        max_rows: usize,
        max_bytes: usize,
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        self.guest_query_approved(sql, params, max_rows, max_bytes, true)
            .await
    }

    /// As [`Tx::guest_query`]; `keep` as in [`Tx::guest_execute_approved`].
    pub async fn guest_query_approved(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        max_rows: usize,
        max_bytes: usize,
        keep: bool,
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        self.refuse_after_loss()?;
        let bound = Bound {
            rows: max_rows,
            bytes: max_bytes,
        };
        self.send_in_call().await?;
        let text = self.guest_text(sql, params);
        let sql = &*text;
        if self.optimistic()? {
            let result = self.inner.fetch(sql, params, bound, keep).await;
            let result = self.deadline_error(result).await;
            self.statement_failed = result.is_err();
            return result;
        }
        self.statement_savepoint().await?;
        let result = self
            .inner
            .fetch(sql, params, bound, keep && self.caches_guest_statements())
            .await;
        self.stop_abandoned(&result).await;
        let result = self.deadline_error(result).await;
        self.end_statement_savepoint(result.is_ok()).await?;
        result
    }

    /// SQLite: a guest query the host stopped reading early (at its row or
    /// byte bound, or a value it could not decode) may still run on sqlx's
    /// worker thread, which notices only when it has another row to send: a
    /// statement that finds no more rows ran on, and once the walls came down
    /// (the next host statement) nothing stopped it and the transaction's
    /// RELEASE queued behind it for good (the eighth read of this round,
    /// issue 23). It is interrupted, and the worker waited for, while the
    /// walls are still up. (PostgreSQL: the next command drains the rows,
    /// still under the `LOCAL` statement timeout.)
    async fn stop_abandoned<T>(&mut self, result: &Result<T, DbError>) {
        let abandoned = matches!(
            result,
            Err(DbError::TooManyRows { .. } | DbError::ResultTooLarge { .. } | DbError::Decode(_))
        );
        if let (true, Inner::Sqlite(tx)) = (abandoned, &mut self.inner) {
            self.walls.interrupt_sqlite();
            // Queued behind the statement: done once it has stopped.
            let _ = tx.lock_handle().await;
        }
    }

    /// Runs one statement of a handler's migration, inside the walls
    /// [`Tx::enter_walls`] put up (migration scope). Never cached.
    pub async fn migration_execute(&mut self, sql: &str) -> Result<u64, DbError> {
        let result = self.inner.run(sql, &[], false).await;
        self.deadline_error(result).await
    }

    /// PostgreSQL keeps one prepared statement per text and connection, with
    /// the parameter types it was prepared with, and sqlx finds it by text
    /// alone. So a guest's text is tagged with its handler's name (a validated
    /// identifier, so it cannot end the comment): two handlers sending the
    /// same text over tables of different shapes must not share it. And with
    /// its parameters' kinds: a statement prepared with a NULL, whose type
    /// PostgreSQL infers (say numeric), must not take a blob or a text there
    /// later, which would go raw into that type's binary decoder (regression,
    /// issue 23: a crafted numeric ran 9.8 s in one row against a 5 s limit).
    fn guest_text<'s>(&self, sql: &'s str, params: &[SqlValue]) -> std::borrow::Cow<'s, str> {
        match (&self.inner, self.walls.handler_in_call()) {
            (Inner::Postgres(..), Some(handler)) => {
                let kinds: String = params.iter().map(SqlValue::kind_letter).collect();
                format!("/* {handler} {kinds} */ {sql}").into()
            }
            _ => sql.into(),
        }
    }

    /// True (once) if SQLite rolled back the whole transaction under a
    /// guest's statement: everything before it in this transaction is gone
    /// (claims, earlier events of the batch, savepoints) and the transaction
    /// is a new, empty one. The caller must redo that work without the guest.
    pub fn take_lost(&mut self) -> bool {
        self.walls.take_lost()
    }

    /// True if SQLite rolled back the whole transaction under a guest's
    /// statement (see [`Tx::take_lost`]), without clearing it.
    pub fn is_lost(&self) -> bool {
        self.walls.is_lost()
    }

    /// A statement the database stopped at the walls' deadline becomes
    /// [`DbError::StatementTimeout`], whatever the driver called it. On
    /// SQLite, a failed guest statement that took the whole transaction with
    /// it (an interrupted write does) is noticed here, and a new transaction
    /// begun in its place (an error if it cannot be).
    async fn deadline_error<T>(&mut self, result: Result<T, DbError>) -> Result<T, DbError> {
        let Err(error) = result else { return result };
        let interrupted = self.walls.after_failure(&mut self.inner).await?;
        let code = match &error {
            DbError::Sqlx(sqlx::Error::Database(db)) => db.code(),
            _ => None,
        };
        match (interrupted, code.as_deref(), self.backend()) {
            (true, ..) | (false, Some("57014"), Backend::Postgres) => Err(DbError::StatementTimeout),
            // SQLITE_NOMEM: SQLite's heap is at its process-wide ceiling
            // under this statement. A limit, the guest's to count: taken for
            // the database's failure (SQLite rolls the transaction back), a
            // statement that always got there was retried for good (the
            // twenty-second read).
            (false, Some("7"), Backend::Sqlite) => Err(DbError::StatementMemory {
                limit_mib: HARD_HEAP_BYTES >> 20,
            }),
            // SQLITE_FULL with room on the database's own disk: the statement
            // filled the temporary directory with its own spill (a sort too
            // large), which SQLite deleted as it failed. The guest's, like
            // the above (the twenty-third read: taken for a full disk, it
            // was retried for good). With the database's disk full it stays
            // the host's outage, waited out.
            (false, Some("13"), Backend::Sqlite) if self.walls.database_has_room(ROOM_AFTER_SPILL) => {
                Err(DbError::StatementSpill)
            }
            _ => Err(error),
        }
    }

    /// The CTE names of the guest statement about to run, as the statement
    /// guard found them: SQLite's authorizer sees a CTE's reads under its name.
    pub fn set_ctes(&mut self, ctes: crate::sandbox::guard::Ctes) {
        self.walls.set_ctes(ctes);
    }

    /// Turns the per-statement savepoints of guest statements off (`false`)
    /// or on. Each costs two round trips on PostgreSQL, and a handler's
    /// statements rarely fail, so the pipeline runs a handler without them
    /// first. If a statement then fails, PostgreSQL has aborted the whole
    /// transaction: every later statement of the call is refused,
    /// [`Tx::take_statement_failed`] says so, and the pipeline rolls the call
    /// back to its savepoint and runs it again with them on, so the handler
    /// sees exactly what it would have seen with them on from the start.
    /// (SQLite undoes a failed statement by itself and needs neither.)
    pub fn set_statement_savepoints(&mut self, on: bool) {
        self.statement_savepoints = on;
        self.statement_failed = false;
    }

    /// True (once) if a guest statement failed with statement savepoints off.
    pub fn take_statement_failed(&mut self) -> bool {
        std::mem::take(&mut self.statement_failed)
    }

    /// No guest statement runs once the database has rolled the transaction
    /// back under an earlier one (see [`Tx::is_lost`]): the walls' new
    /// transaction holds none of the event's work, and the host may park the
    /// event in it. Regression (the forty-third adversarial read, issue 23):
    /// a short INSERT after SQLite's heap ceiling took the transaction ran
    /// in the new one (too few steps for its deadline check) and committed
    /// with the event's dead letter, so a replay applied the event again.
    fn refuse_after_loss(&self) -> Result<(), DbError> {
        if self.walls.is_lost() {
            return Err(DbError::AfterFailedStatement);
        }
        Ok(())
    }

    /// With statement savepoints off on PostgreSQL: `Err` if an earlier
    /// statement of the call failed (the transaction is aborted), else `Ok(true)`.
    fn optimistic(&self) -> Result<bool, DbError> {
        if self.statement_savepoints || self.backend() != Backend::Postgres {
            return Ok(false);
        }
        if self.statement_failed {
            return Err(DbError::AfterFailedStatement);
        }
        Ok(true)
    }

    fn caches_guest_statements(&self) -> bool {
        self.backend() == Backend::Postgres
    }

    async fn statement_savepoint(&mut self) -> Result<(), DbError> {
        if self.backend() == Backend::Postgres {
            self.savepoint(STATEMENT_SAVEPOINT).await?;
        }
        Ok(())
    }

    async fn end_statement_savepoint(&mut self, succeeded: bool) -> Result<(), DbError> {
        if self.backend() == Backend::Postgres {
            if succeeded {
                self.release(STATEMENT_SAVEPOINT).await?;
            } else {
                self.rollback_to(STATEMENT_SAVEPOINT).await?;
            }
        }
        Ok(())
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

impl Inner {
    async fn run(&mut self, sql: &str, params: &[SqlValue], persistent: bool) -> Result<u64, DbError> {
        let done = match self {
            Inner::Sqlite(tx) => {
                let query = bind_sqlite(sqlx::query(sql), params).persistent(persistent);
                query.execute(&mut **tx).await?.rows_affected()
            }
            Inner::Postgres(tx, within) => {
                let query = bind_postgres(sqlx::query(sql), params, &[]).persistent(persistent);
                answered(*within, query.execute(&mut **tx)).await?.rows_affected()
            }
        };
        Ok(done)
    }

    async fn fetch(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        bound: Bound,
        persistent: bool,
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        self.fetch_with(sql, params, &[], bound, persistent).await
    }

    /// As [`Inner::fetch`], with PostgreSQL arrays after `params` (the
    /// host's gates only; SQLite has no arrays).
    async fn fetch_with(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        arrays: &[PgArray<'_>],
        bound: Bound,
        persistent: bool,
    ) -> Result<Vec<Vec<SqlValue>>, DbError> {
        let mut rows = Vec::new();
        let mut bytes = 0;
        // Rows are decoded one at a time as they stream in, and counted
        // before they are kept, so an oversized result stops at its bound
        // instead of being buffered whole.
        let mut keep = |row: Vec<SqlValue>| -> Result<(), DbError> {
            if rows.len() == bound.rows {
                return Err(DbError::TooManyRows { limit: bound.rows });
            }
            // What the host holds for the row, not only its values'
            // bytes: 1,664 empty texts a row counted nothing, and 100,000
            // such rows held 5 GB (the fifteenth read of issue 23's third round).
            bytes += std::mem::size_of::<Vec<SqlValue>>()
                + row
                    .iter()
                    .map(|value| std::mem::size_of::<SqlValue>() + value.size())
                    .sum::<usize>();
            if bytes > bound.bytes {
                return Err(DbError::ResultTooLarge { limit: bound.bytes });
            }
            rows.push(row);
            Ok(())
        };
        match self {
            Inner::Sqlite(tx) => {
                assert!(
                    arrays.is_empty(),
                    "SQLite has no arrays: the host's gates are PostgreSQL's"
                );
                let query = bind_sqlite(sqlx::query(sql), params).persistent(persistent);
                let mut stream = query.fetch(&mut **tx);
                while let Some(row) = stream.try_next().await? {
                    keep(decode_sqlite(&row)?)?;
                }
            }
            Inner::Postgres(tx, within) => {
                let query = bind_postgres(sqlx::query(sql), params, arrays).persistent(persistent);
                let mut stream = query.fetch(&mut **tx);
                let rows = async {
                    while let Some(row) = stream.try_next().await? {
                        keep(decode_postgres(&row)?)?;
                    }
                    Ok::<(), DbError>(())
                };
                answered(*within, rows).await?;
            }
        }
        Ok(rows)
    }
}

/// The walls send the host's own statements through the transaction's connection.
impl Connection for Inner {
    fn backend(&self) -> Backend {
        match self {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Postgres(..) => Backend::Postgres,
        }
    }

    async fn statement(&mut self, sql: &str) -> Result<(), DbError> {
        self.run(sql, &[], true).await.map(drop)
    }

    /// The simple query protocol: several statements, one round trip, no
    /// parameters. The text is the host's, never a guest's.
    async fn statements(&mut self, sql: &str) -> Result<(), DbError> {
        match self {
            Inner::Sqlite(tx) => {
                sqlx::Executor::execute(&mut **tx, sql).await?;
            }
            Inner::Postgres(tx, within) => {
                answered(*within, sqlx::Executor::execute(&mut **tx, sql)).await?;
            }
        }
        Ok(())
    }

    fn sqlite(&mut self) -> Option<&mut SqliteConnection> {
        match self {
            Inner::Sqlite(tx) => Some(&mut **tx),
            Inner::Postgres(..) => None,
        }
    }
}

/// How much one guest query may return.
#[derive(Debug, Clone, Copy)]
struct Bound {
    rows: usize,
    bytes: usize,
}
