//! The database: one pool, one backend, and transactions the caller owns.
//!
//! [`Database`] hides whether the backend is SQLite or PostgreSQL behind one
//! small API of SQL text plus [`SqlValue`] parameters. The query functions for
//! each host table live in the file named after the table and take a
//! `&mut Tx`, so the pipeline decides what shares a transaction. Nothing here
//! decides policy: errors go back to the caller, who retries or fails.

pub mod audit;
pub mod business_keys;
pub mod columns;
pub mod dead_letter_groups;
pub mod dead_letters;
mod error;
pub mod headers;
pub mod inbox;
pub mod invariants;
mod logins;
pub mod migrate;
pub mod offsets;
pub mod open;
pub mod outbox;
pub mod partitions;
pub mod seal;
pub mod snapshot;
mod tx;
mod value;
mod walls;

pub use crate::config::Backend;
pub use error::DbError;
pub use open::{OpenError, open, open_waiting, redact_url};
pub use tx::Tx;
pub use value::{DecodeError, PgArray, SqlValue, UnsupportedColumn};
pub use walls::{HOST_SEARCH_PATH, Walls};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

#[derive(Clone)]
pub struct Database {
    pool: Pool,
    /// SQLite has one writer at a time. The pipeline's transactions queue for
    /// it here, where a waiter wakes the moment the previous one ends, instead
    /// of in SQLite's busy handler, which sleeps in steps of up to 100 ms.
    writer: Option<Arc<Semaphore>>,
    /// PostgreSQL: the handlers' own logins and the host's key to the gates.
    guests: Option<Arc<Guests>>,
    /// PostgreSQL: how long each statement of [`Database::query`] may run
    /// ([`Database::with_read_deadline`]); none by default.
    read_deadline: Option<Duration>,
}

/// PostgreSQL's handler sessions (see [`logins`]).
struct Guests {
    key: Arc<logins::HostKey>,
    pools: logins::GuestPools,
}

#[derive(Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The PostgreSQL schema of the host's own tables. Host connections put it
/// first on their `search_path` ([`HOST_SEARCH_PATH`]), so host SQL is the
/// same text on both backends.
pub const HOST_SCHEMA: &str = "inboxd";

/// The PostgreSQL schema of a handler's own tables. Handler names are
/// validated identifiers (`config::is_identifier`), so this is safe to splice.
pub fn handler_schema(handler: &str) -> String {
    format!("handler_{handler}")
}

/// An identifier, quoted as SQLite and PostgreSQL read it.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The PostgreSQL role a handler's SQL runs as, logged in as itself: it owns
/// the handler's schema, is a member of no other role and has no privileges
/// on the host's tables.
pub fn handler_role(handler: &str) -> String {
    format!("inboxd_handler_{handler}")
}

/// What follows the handler's schema on its search path: the catalog, then
/// (explicitly last, so it never shadows a name) `pg_temp`.
pub const HANDLER_SEARCH_PATH_TAIL: &str = "pg_catalog,pg_temp";

/// Serialises schema creation and migrations between hosts starting together
/// (an arbitrary constant, the key of a PostgreSQL advisory lock).
const MIGRATION_LOCK_KEY: i64 = 0x1b0c_d000_0001;

/// The first key of a handler's own migration lock; the second is a hash of
/// its name (see `Tx::lock_handler_migrations`).
const HANDLER_MIGRATION_LOCK_CLASS: i32 = 0x1b0c_d001;

/// How long a connection attempt or a wait for a free connection may take
/// before the caller sees an error (and, in the pipeline, backs off and retries).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// A PostgreSQL connection idle this long is pinged before it is handed
/// out; a busy one is not (the ping would be a round trip per transaction).
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(30);
/// SQLite writers queue on one lock; wait this long for it instead of failing.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a SQLite connection coming back to the pool is fit for the next
/// transaction: no transaction open in SQLite, none counted by sqlx.
///
/// They can disagree after SQLite rolls a transaction back by itself (a
/// full disk, an I/O error, memory: `SQLITE_FULL` and the like end the whole
/// transaction, not just the statement). sqlx's `ROLLBACK` then fails and
/// it keeps counting the transaction, so it begins the next one on this
/// connection with a `SAVEPOINT` and ends a rolled-back one with `ROLLBACK
/// TO`, which leaves it open: the connection went back to the pool holding
/// the write lock, every later writer waited on it for good, and the next
/// "commit" on it was a `RELEASE` of a nested savepoint, which commits
/// nothing (found by issue 27's disk-full scenario). A connection in doubt is
/// closed instead, which rolls back whatever it still holds.
async fn sqlite_settled(conn: &mut sqlx::SqliteConnection) -> bool {
    use sqlx::Connection as _;
    // Through the connection's worker, so a rollback queued by a dropped
    // transaction has run first.
    let Ok(mut handle) = conn.lock_handle().await else {
        return false;
    };
    // SAFETY: the locked handle is ours alone while it lives; this only
    // reads the connection's autocommit flag.
    let open_in_sqlite =
        unsafe { libsqlite3_sys::sqlite3_get_autocommit(handle.as_raw_handle().as_ptr()) } == 0;
    // A transaction dropped with a handler's walls up left them draining
    // (see `ConnectionWalls::drain`); after this trip through the worker
    // nothing of it runs any more, and they come down.
    if let Some(walls) = crate::sandbox::authorizer::walls_of(handle.as_raw_handle().as_ptr())
        && walls.is_up()
    {
        walls.leave();
    }
    drop(handle);
    let settled = !open_in_sqlite && !conn.is_in_transaction();
    if !settled {
        tracing::warn!(
            open_in_sqlite,
            "a SQLite connection came back with a transaction still counted open; closing it"
        );
    }
    settled
}

impl Database {
    /// Connects lazily-validated: the pool opens its first connection here so a
    /// wrong URL fails at start, not at the first event.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, DbError> {
        let mut guests = None;
        let pool = if Backend::of_url(url) == Some(Backend::Sqlite) {
            crate::sandbox::sqlite_memory::bound_heap();
            let options = SqliteConnectOptions::from_str(url)?
                // Runs of 64 rows in a handler's sorts, not 2 (see the module).
                .pragma("cache_size", crate::sandbox::sqlite_memory::cache_size_pragma())
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // FULL: a committed transaction survives power loss, so the
                // offsets stored with it never run ahead of the effects.
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
                .foreign_keys(true);
            let pool = SqlitePoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                // No ping on every acquire (a worker-thread handoff per
                // transaction): the file cannot go away under the connection.
                .test_before_acquire(false)
                // Every connection gets the second wall (the allowlist
                // authorizer) and the statement deadline once, when it opens;
                // they stay inert until a handler's walls go up.
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        let mut handle = conn.lock_handle().await?;
                        // SAFETY: the locked handle is ours alone while it lives.
                        unsafe { crate::sandbox::authorizer::install(handle.as_raw_handle().as_ptr()) };
                        Ok(())
                    })
                })
                // A connection goes back to the pool only with no transaction
                // open, as SQLite and sqlx both see it (see `sqlite_settled`).
                .after_release(|conn, _| Box::pin(async move { Ok(sqlite_settled(conn).await) }))
                .connect_with(options)
                .await?;
            Pool::Sqlite(pool)
        } else {
            let base = PgConnectOptions::from_str(url)?;
            guests = Some(Arc::new(Guests {
                key: Arc::new(logins::HostKey::new()),
                pools: logins::GuestPools::new(base.clone(), max_connections),
            }));
            let options = base
                .application_name("inboxd")
                .options([("search_path", HOST_SEARCH_PATH)]);
            let pool = PgPoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                // No ping on every acquire (a round trip per transaction):
                // only a connection idle for a while is checked, since a
                // NAT or load balancer may have dropped it silently and its
                // first statement would then wait for TCP to give up, far
                // past any timeout. A connection that died busy fails its
                // statement, the transaction rolls back as on any database
                // error, sqlx closes it, and the pipeline retries.
                .test_before_acquire(false)
                .before_acquire(|conn, meta| {
                    Box::pin(async move {
                        if meta.idle_for >= PING_IF_IDLE_FOR {
                            sqlx::Connection::ping(conn).await?;
                        }
                        Ok(true)
                    })
                })
                .connect_with(options)
                .await?;
            Pool::Postgres(pool)
        };
        let writer = matches!(pool, Pool::Sqlite(_)).then(|| Arc::new(Semaphore::new(1)));
        Ok(Self {
            pool,
            writer,
            guests,
            read_deadline: None,
        })
    }

    /// How many guest calls one handler may run at once: one per
    /// transaction, so on PostgreSQL one per connection of its own login's
    /// pool, and on SQLite one (its one writer holds every batch).
    pub fn calls_per_handler(&self) -> usize {
        match &self.guests {
            Some(guests) => guests.pools.max_connections() as usize,
            None => 1,
        }
    }

    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// Applies the host's own migrations (`migrations/<backend>/`, embedded at build time).
    pub async fn migrate_host(&self) -> Result<(), DbError> {
        match &self.pool {
            Pool::Sqlite(pool) => sqlx::migrate!("../migrations/sqlite").run(pool).await?,
            Pool::Postgres(pool) => {
                // sqlx keeps its history table in the first schema of the
                // search path, so the host schema must exist first.
                let mut tx = self.begin().await?;
                tx.lock_migrations().await?;
                tx.execute(&format!("CREATE SCHEMA IF NOT EXISTS {HOST_SCHEMA}"), &[])
                    .await?;
                tx.commit().await?;
                sqlx::migrate!("../migrations/postgres").run(pool).await?
            }
        }
        Ok(())
    }

    /// How host code names a handler's table: schema-qualified on PostgreSQL.
    pub fn handler_table(&self, handler: &str, table: &str) -> String {
        match self.backend() {
            Backend::Sqlite => table.to_owned(),
            Backend::Postgres => format!("{}.{table}", handler_schema(handler)),
        }
    }

    pub async fn begin(&self) -> Result<Tx, DbError> {
        Ok(match &self.pool {
            Pool::Sqlite(pool) => Tx::sqlite(pool.begin().await?),
            Pool::Postgres(pool) => Tx::postgres(pool.begin().await?, self.gate_key(pool)),
        })
    }

    /// The host's key to the gates (PostgreSQL), registered through `host`
    /// the first time a gate is called.
    fn gate_key(&self, host: &PgPool) -> tx::GateKey {
        let guests = self
            .guests
            .as_ref()
            .expect("a PostgreSQL database has its guests");
        tx::GateKey {
            key: guests.key.clone(),
            host: host.clone(),
        }
    }

    /// Begins a transaction in which `handler`'s SQL will run: on PostgreSQL
    /// on a session logged in as the handler's own role (see [`logins`]),
    /// where the host writes its tables through the gates; on SQLite a
    /// pipeline write transaction ([`Database::begin_write`]). Every
    /// transaction that runs a guest or a handler's migration begins here.
    pub async fn begin_guest(&self, handler: &str) -> Result<Tx, DbError> {
        match &self.pool {
            Pool::Sqlite(_) => self.begin_write().await,
            Pool::Postgres(host) => {
                let guests = self
                    .guests
                    .as_ref()
                    .expect("a PostgreSQL database has its guests");
                // Held by the transaction: however many pools the handler's
                // login renewals leave open, it runs at most
                // `max_connections` transactions (and so guest calls) at once.
                let permit = guests
                    .pools
                    .transaction_permit(handler, ACQUIRE_TIMEOUT)
                    .await
                    .ok_or(DbError::Sqlx(sqlx::Error::PoolTimedOut))?;
                let mut renewed = false;
                loop {
                    let pool = guests.pools.pool(host, handler).await?;
                    // A connection the pool hands out on a blackholed network
                    // would wait for TCP at its BEGIN.
                    let limit = ACQUIRE_TIMEOUT + tx::HANDLER_ROUND_TRIP;
                    let begun = tokio::time::timeout(limit, pool.begin())
                        .await
                        .map_err(|_| DbError::NoAnswer { waited: limit })?;
                    match begun {
                        Ok(tx) => {
                            return Ok(Tx::postgres(tx, self.gate_key(host))
                                .of_handler(handler, pool)
                                .await?
                                .holding(Some(permit)));
                        }
                        // The role's password is not the one this database
                        // keeps: roles are shared by every database on the
                        // server, and another database's host set a new one.
                        // Set this database's anew, once, and log in with it.
                        Err(sqlx::Error::Database(e))
                            if !renewed && e.code().is_some_and(|c| c.starts_with("28")) =>
                        {
                            tracing::warn!(handler, "the handler's database login failed ({e}); renewing it");
                            guests.pools.forget(handler);
                            // On the host's own pool, whose round trips have no
                            // bound of their own: a blackhole that begins
                            // during the renewal must end it as an outage (the
                            // pump retries and says so), not hold the partition
                            // silent until TCP gives up (issue 27).
                            let limit = ACQUIRE_TIMEOUT + 3 * tx::HANDLER_ROUND_TRIP;
                            tokio::time::timeout(limit, migrate::renew_login(self, handler))
                                .await
                                .map_err(|_| DbError::NoAnswer { waited: limit })??;
                            renewed = true;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
    }

    /// As [`Database::begin_guest`], for a handler's migrations: on SQLite
    /// the write lock is taken at `BEGIN` (see [`Database::begin_immediate`]).
    pub async fn begin_migration(&self, handler: &str) -> Result<Tx, DbError> {
        match &self.pool {
            Pool::Sqlite(_) => self.begin_immediate().await,
            Pool::Postgres(_) => self.begin_guest(handler).await,
        }
    }

    /// Begins one of the pipeline's write transactions: as [`Database::begin`],
    /// queued in-process behind the other pipeline writers on SQLite.
    /// The caller must not begin another transaction while it holds this one.
    pub async fn begin_write(&self) -> Result<Tx, DbError> {
        let permit = self.writer_permit().await;
        Ok(self.begin().await?.holding(permit))
    }

    /// Begins a write transaction that reads before it writes (admin changes,
    /// handler migrations). On SQLite it takes the write lock at `BEGIN`: a
    /// transaction that starts with a read and then writes fails at once with
    /// "database is locked" if another connection committed in between (its
    /// snapshot is stale, so the busy timeout cannot help), while `BEGIN
    /// IMMEDIATE` waits its turn under the busy timeout.
    pub async fn begin_immediate(&self) -> Result<Tx, DbError> {
        let permit = self.writer_permit().await;
        let tx = match &self.pool {
            Pool::Sqlite(pool) => Tx::sqlite(pool.begin_with("BEGIN IMMEDIATE").await?),
            Pool::Postgres(pool) => Tx::postgres(pool.begin().await?, self.gate_key(pool)),
        };
        Ok(tx.holding(permit))
    }

    async fn writer_permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match &self.writer {
            Some(writer) => Some(
                writer
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the writer queue is never closed"),
            ),
            None => None,
        }
    }

    /// This database, with each statement of [`Database::query`] (and what
    /// reads through it) ended by PostgreSQL at `deadline`: a read whose
    /// caller stops waiting for it should not run on in the server (issue 23,
    /// the twentieth read: the counts of `/metrics` gave up after 5 s and
    /// their statements ran on). SQLite's reads are not interrupted.
    pub fn with_read_deadline(&self, deadline: Duration) -> Database {
        Database {
            read_deadline: Some(deadline),
            ..self.clone()
        }
    }

    /// Runs one read outside any transaction.
    pub async fn query(&self, sql: &str, params: &[SqlValue]) -> Result<Vec<Vec<SqlValue>>, DbError> {
        let mut tx = self.begin().await?;
        if let (Some(deadline), Backend::Postgres) = (self.read_deadline, self.backend()) {
            // `LOCAL`: it ends with this transaction, the pooled session keeps none of it.
            let ms = deadline.as_millis().max(1);
            tx.execute(&format!("SET LOCAL statement_timeout = {ms}"), &[])
                .await?;
        }
        let rows = tx.query(sql, params).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// Reads a single `COUNT(*)`-style integer.
    pub async fn query_i64(&self, sql: &str, params: &[SqlValue]) -> Result<i64, DbError> {
        let rows = self.query(sql, params).await?;
        Ok(rows
            .first()
            .and_then(|r| r.first())
            .and_then(SqlValue::as_i64)
            .unwrap_or(0))
    }

    /// A `SELECT handler, COUNT(*) ... GROUP BY handler` of the host's (or
    /// another integer per handler), as a map.
    pub async fn counts_by_handler(&self, sql: &str) -> Result<BTreeMap<String, i64>, DbError> {
        let rows = self.query(sql, &[]).await?;
        let counts = rows.into_iter().map(|row| {
            let mut c = columns::Columns::new("count per handler", row);
            Ok((c.text("handler")?, c.int("count")?))
        });
        Ok(counts.collect::<Result<_, DecodeError>>()?)
    }

    pub async fn close(&self) {
        if let (Some(guests), Pool::Postgres(host)) = (&self.guests, &self.pool) {
            guests.pools.close().await;
            guests.key.retire(host).await;
        }
        match &self.pool {
            Pool::Sqlite(pool) => pool.close().await,
            Pool::Postgres(pool) => pool.close().await,
        }
    }
}

/// `column IN ($n, ...)` over `values`, pushed onto `params` and numbered
/// after what is there. An empty list is `1 = 0`: `IN ()` is not SQL, and
/// `IN (NULL)` would make `NOT (...)` match nothing as well.
pub fn in_list<'a>(
    column: &str,
    params: &mut Vec<SqlValue>,
    values: impl IntoIterator<Item = &'a str>,
) -> String {
    let mut marks = Vec::new();
    for value in values {
        params.push(value.into());
        marks.push(format!("${}", params.len()));
    }
    if marks.is_empty() {
        return "1 = 0".to_owned();
    }
    format!("{column} IN ({})", marks.join(", "))
}

/// Wall-clock time in Unix milliseconds, the unit of every time column.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `(?, ?, ...), (?, ?, ...)`: the VALUES of a multi-row statement of the
/// host's on SQLite, `rows` rows of `columns` anonymous parameters. sqlx asks
/// SQLite the name of every parameter it binds, and that is a walk of the
/// statement's named parameters: with `$n` names a 64-row INSERT cost time
/// quadratic in its rows (3.5% of the host's CPU in a profile of mode (a)).
pub(crate) fn anonymous_rows(rows: usize, columns: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(", "));
    vec![row; rows].join(", ")
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::Database;

    /// A migrated database for one test; a SQLite file's folder is removed
    /// when it drops (a PostgreSQL test database stays on the throwaway server).
    pub struct TestDb {
        db: Database,
        _dir: Option<tempfile::TempDir>,
    }

    impl std::ops::Deref for TestDb {
        type Target = Database;
        fn deref(&self) -> &Database {
            &self.db
        }
    }

    /// A fresh migrated SQLite database in a temporary folder (WAL needs a real file).
    pub async fn sqlite_db() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("test.sqlite").display());
        let db = Database::connect(&url, 2).await.unwrap();
        db.migrate_host().await.unwrap();
        TestDb { db, _dir: Some(dir) }
    }

    /// The URL of a fresh, empty database on the PostgreSQL server
    /// `scripts/test` starts (`INBOXD_TEST_POSTGRES`); `None` when it is not
    /// set, as under a plain `cargo test`.
    pub async fn postgres_url() -> Option<String> {
        use sqlx::Connection;
        let admin_url = std::env::var("INBOXD_TEST_POSTGRES").ok()?;
        let name = format!("inboxd_unit_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(&admin_url).await.unwrap();
        sqlx::Executor::execute(&mut admin, format!("CREATE DATABASE {name}").as_str())
            .await
            .unwrap();
        let base = admin_url.rsplit_once('/').expect("a database path").0;
        Some(format!("{base}/{name}"))
    }

    /// A fresh migrated database on that server (see [`postgres_url`]).
    pub async fn postgres_db() -> Option<TestDb> {
        let db = Database::connect(&postgres_url().await?, 4).await.unwrap();
        db.migrate_host().await.unwrap();
        Some(TestDb { db, _dir: None })
    }

    /// SQLite, and PostgreSQL too when the suite's server is there.
    pub async fn each_backend() -> Vec<TestDb> {
        let mut all = vec![sqlite_db().await];
        match postgres_db().await {
            Some(db) => all.push(db),
            None => eprintln!("INBOXD_TEST_POSTGRES is not set: PostgreSQL skipped (scripts/test sets it)"),
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::sqlite_db;

    /// Regression (issue 27's disk-full scenario): after SQLite rolled a
    /// transaction back by itself, its connection went back to the pool
    /// still counted in a transaction by sqlx; the next transaction on it
    /// held the write lock for good and the one after "committed" nothing.
    #[tokio::test]
    async fn a_transaction_sqlite_ended_by_itself_leaves_no_lock_and_loses_no_commit() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("test.sqlite").display());
        // One connection, so every transaction below reuses it.
        let db = super::Database::connect(&url, 1).await.unwrap();
        db.migrate_host().await.unwrap();
        let super::Pool::Sqlite(pool) = &db.pool else {
            unreachable!()
        };
        let insert =
            |bucket: i64| format!("INSERT INTO outbox_leases (bucket, lease_until) VALUES ({bucket}, 0)");

        let mut tx = pool.begin().await.unwrap();
        sqlx::query(&insert(100)).execute(&mut *tx).await.unwrap();
        {
            // What SQLite does on SQLITE_FULL or an I/O error: the whole
            // transaction rolled back, behind sqlx's back.
            let mut handle = tx.lock_handle().await.unwrap();
            let sql = std::ffi::CString::new("ROLLBACK").unwrap();
            // SAFETY: the locked handle is ours alone while it lives.
            let rc = unsafe {
                libsqlite3_sys::sqlite3_exec(
                    handle.as_raw_handle().as_ptr(),
                    sql.as_ptr(),
                    None,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(rc, libsqlite3_sys::SQLITE_OK);
        }
        drop(tx);

        // A transaction that writes and is rolled back, then one that commits.
        let mut tx = db.begin().await.unwrap();
        tx.execute(&insert(101), &[]).await.unwrap();
        drop(tx);
        let mut tx = db.begin().await.unwrap();
        tx.execute(&insert(102), &[]).await.unwrap();
        tx.commit().await.unwrap();

        // Another connection sees the commit and can write: nothing is held.
        let other = super::Database::connect(&url, 1).await.unwrap();
        let seen = other
            .query_i64("SELECT COUNT(*) FROM outbox_leases WHERE bucket >= 100", &[])
            .await
            .unwrap();
        assert_eq!(seen, 1, "only bucket 102 committed");
        let mut tx = other.begin().await.unwrap();
        let sql = insert(103);
        let write = tokio::time::timeout(std::time::Duration::from_secs(5), tx.execute(&sql, &[]));
        write.await.expect("the write lock is free").unwrap();
        tx.commit().await.unwrap();
    }

    /// A read with a deadline is ended by PostgreSQL at it (not only given
    /// up on by the host), and the pooled session keeps no deadline after.
    #[tokio::test]
    async fn postgres_ends_a_read_at_its_deadline_and_the_session_keeps_none() {
        let Some(db) = super::test_support::postgres_db().await else {
            return eprintln!("INBOXD_TEST_POSTGRES is not set: skipped");
        };
        let bounded = db.with_read_deadline(std::time::Duration::from_millis(300));
        let started = std::time::Instant::now();
        let error = bounded.query("SELECT pg_sleep(5)", &[]).await.unwrap_err();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(3),
            "ended by the server: {:?}",
            started.elapsed()
        );
        assert!(error.to_string().contains("statement timeout"), "{error}");
        // Every pooled session: the setting was LOCAL to its transaction.
        for _ in 0..6 {
            let rows = db.query("SHOW statement_timeout", &[]).await.unwrap();
            assert_eq!(rows[0][0].as_str(), Some("0"), "{rows:?}");
        }
    }

    /// A transaction that reads, then writes after another connection
    /// committed, must wait its turn rather than fail: what an upload does
    /// (migration checksums, then DDL and the version row) while handlers run.
    #[tokio::test]
    async fn read_then_write_transactions_do_not_fail_when_another_writer_commits_between() {
        let db = sqlite_db().await;
        let mut tx = db.begin_immediate().await.unwrap();
        tx.query("SELECT COUNT(*) FROM handlers", &[]).await.unwrap();
        // Another writer outside the pipeline's queue (the relay, a purge).
        let other = tokio::spawn({
            let db = db.clone();
            async move {
                let mut tx = db.begin().await?;
                tx.execute("UPDATE outbox_leases SET lease_until = 1 WHERE bucket = 0", &[])
                    .await?;
                tx.commit().await
            }
        });
        // With the write lock taken at BEGIN, the other writer cannot commit
        // in between (with a plain BEGIN it would, and the write below would
        // fail with "database is locked").
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while std::time::Instant::now() < deadline {
            assert!(
                !other.is_finished(),
                "another writer committed inside our transaction"
            );
            tokio::task::yield_now().await;
        }
        tx.execute(
            "INSERT INTO handler_deployments (name, active_version, updated_at) VALUES ('h', 1, 0)",
            &[],
        )
        .await
        .expect("the write lock was taken at BEGIN");
        tx.commit().await.unwrap();
        other
            .await
            .unwrap()
            .expect("the other writer waited, then committed");
    }
}
