//! PostgreSQL sessions that belong to a handler, and the key that lets the
//! host write its own tables from inside them (issue 23).
//!
//! A handler's SQL runs on a connection logged in as the handler's own role
//! ([`handler_role`]), which owns the handler's schema and is a member of no
//! other role. Whatever a guest's SQL does to its session (`RESET ROLE`,
//! `SET ROLE NONE`, `set_config('role', ...)`, a function that runs a query),
//! it stays that role: there is nothing more privileged to become. The host's
//! own writes in that transaction (claims, offsets, outbox, dead letters,
//! migration records) go through the `inboxd_gate` functions
//! (migrations/postgres/0006_host_gates.sql), which demand the host's [`HostKey`].
//!
//! Each handler gets a pool of such connections ([`GuestPools`]). When a
//! connection goes back to its pool, everything a session can keep past a
//! transaction is reset ([`RESET_SESSION`]); one that holds a statement the
//! guest prepared is closed instead.
//!
//! Never here: a guest's statement text. The passwords are the host's, made
//! by [`super::migrate::prepare_handler`], stored where no handler can read them.

use super::{DbError, HANDLER_SEARCH_PATH_TAIL, handler_role, handler_schema};
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Executor, Row};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};

/// What a session can carry from one transaction into the next, reset when a
/// handler's connection goes back to its pool: settings made with `SET` or
/// `set_config(..., false)`, open cursors, `LISTEN`s, temporary tables,
/// sequence state and session-level advisory locks. The last statement
/// counts the prepared statements the session's own SQL made (`PREPARE`);
/// the host's are prepared over the protocol and not counted. Sent by the
/// host alone, outside any transaction.
const RESET_SESSION: &str = "RESET ALL; CLOSE ALL; UNLISTEN *; DISCARD TEMP; DISCARD SEQUENCES; \
     SELECT pg_catalog.pg_advisory_unlock_all()::pg_catalog.text, \
     (SELECT pg_catalog.count(*) FROM pg_catalog.pg_prepared_statements WHERE from_sql)";

/// PBKDF2 rounds of a handler login's SCRAM verifier: PostgreSQL's own
/// default (`scram_iterations`).
const SCRAM_ITERATIONS: u32 = 4096;

/// The SCRAM-SHA-256 verifier of `password` (RFC 5802, RFC 7677), in the form
/// PostgreSQL stores and accepts in `ALTER ROLE ... PASSWORD`:
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`, base64.
/// Its characters are base64's, `$` and `:`: nothing in it ends a literal.
pub fn scram_verifier(password: &str) -> String {
    use base64::Engine as _;
    use hmac::{Hmac, Mac};
    use sha2::{Digest, Sha256};
    let salt: [u8; 16] = rand::random();
    let mut salted = [0u8; 32];
    pbkdf2::pbkdf2::<Hmac<Sha256>>(password.as_bytes(), &salt, SCRAM_ITERATIONS, &mut salted)
        .expect("HMAC takes a key of any length");
    let keyed = |text: &[u8]| {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&salted).expect("HMAC takes a key of any length");
        mac.update(text);
        mac.finalize().into_bytes()
    };
    let stored = Sha256::digest(keyed(b"Client Key"));
    let server = keyed(b"Server Key");
    let b64 = base64::engine::general_purpose::STANDARD;
    format!(
        "SCRAM-SHA-256${SCRAM_ITERATIONS}:{}${}:{}",
        b64.encode(salt),
        b64.encode(stored),
        b64.encode(server)
    )
}

/// From this many relations in one join search on, a handler's statement is
/// planned by PostgreSQL's genetic search (see the session options).
pub const GUEST_GEQO_THRESHOLD: u32 = 8;

/// `work_mem` of a handler's sessions: what each sorting or storing node of
/// a plan may hold before it spills (the guard bounds how many nodes a
/// statement makes: `sandbox::postgres::plan_memory`).
const GUEST_WORK_MEM: &str = "1MB";

/// The host's key to the gates: random per process, registered (its SHA-256
/// only) in `inboxd.handler_gate_keys` on first use.
pub struct HostKey {
    secret: String,
    registered: OnceCell<()>,
}

impl HostKey {
    pub fn new() -> Self {
        let bytes: [u8; 32] = rand::random();
        Self {
            secret: hex::encode(bytes),
            registered: OnceCell::new(),
        }
    }

    /// The key, registered through the host's own pool the first time.
    pub async fn secret(&self, host: &PgPool) -> Result<&str, DbError> {
        self.registered
            .get_or_try_init(|| async {
                let digest = Sha256::digest(self.secret.as_bytes()).to_vec();
                let register = sqlx::query(
                    "INSERT INTO inboxd.handler_gate_keys (digest, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                )
                .bind(digest)
                .bind(super::now_ms())
                .execute(host);
                // Every partition's first batch waits on this one insert, on
                // the host's pool, whose round trips have no bound of their
                // own: a blackholed network must fail it as an outage, which
                // the pump retries, not hold every partition silent.
                let limit = super::ACQUIRE_TIMEOUT + super::tx::HANDLER_ROUND_TRIP;
                match tokio::time::timeout(limit, register).await {
                    Ok(done) => done.map(drop).map_err(DbError::from),
                    Err(_) => Err(DbError::NoAnswer { waited: limit }),
                }
            })
            .await?;
        Ok(&self.secret)
    }

    /// Forgets the key in the database (a host that stops): the gates no
    /// longer accept it, whoever might have learnt it.
    pub async fn retire(&self, host: &PgPool) {
        if self.registered.get().is_none() {
            return;
        }
        let digest = Sha256::digest(self.secret.as_bytes()).to_vec();
        let retired = sqlx::query("DELETE FROM inboxd.handler_gate_keys WHERE digest = $1")
            .bind(digest)
            .execute(host)
            .await;
        if let Err(e) = retired {
            tracing::warn!("could not retire the host's gate key: {e}");
        }
    }
}

/// The handlers' connection pools, made on first use.
pub struct GuestPools {
    base: PgConnectOptions,
    max_connections: u32,
    pools: Mutex<HashMap<String, PgPool>>,
    /// Per handler, one permit per transaction it may have open at once,
    /// across every pool it has had. Regression (the forty-sixth read,
    /// issue 23): a renewed login (`forget`) made a new pool while the old
    /// one's connections still ran their transactions, and concurrent
    /// renewals made several, so a handler could run a multiple of its
    /// `max_connections` calls and take Wasm instances that are other
    /// handlers' share (see `config::instances_short`).
    transactions: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl GuestPools {
    pub fn new(base: PgConnectOptions, max_connections: u32) -> Self {
        Self {
            base,
            max_connections,
            pools: Mutex::default(),
            transactions: Mutex::default(),
        }
    }

    /// Connections per handler.
    pub fn max_connections(&self) -> u32 {
        self.max_connections
    }

    /// The right to open one more transaction of `handler`, waiting at most
    /// `wait`; held for the transaction's life. `None`: `max_connections` of
    /// them stayed open for `wait`.
    pub async fn transaction_permit(&self, handler: &str, wait: Duration) -> Option<OwnedSemaphorePermit> {
        let permits = {
            let mut all = self.transactions.lock().unwrap_or_else(|p| p.into_inner());
            match all.get(handler) {
                Some(permits) => permits.clone(),
                // The handler's first transaction: no name is copied after it.
                None => all
                    .entry(handler.to_owned())
                    .or_insert_with(|| Arc::new(Semaphore::new(self.max_connections as usize)))
                    .clone(),
            }
        };
        tokio::time::timeout(wait, permits.acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// The pool of `handler`'s connections; its login is read through `host`.
    pub async fn pool(&self, host: &PgPool, handler: &str) -> Result<PgPool, DbError> {
        if let Some(pool) = self.lock().get(handler) {
            return Ok(pool.clone());
        }
        let read = sqlx::query_scalar("SELECT password FROM inboxd.handler_logins WHERE handler = $1")
            .bind(handler)
            .fetch_optional(host);
        // On the host's pool, bounded as a handler session's round trips are.
        let limit = super::ACQUIRE_TIMEOUT + super::tx::HANDLER_ROUND_TRIP;
        let password: Option<String> = tokio::time::timeout(limit, read)
            .await
            .map_err(|_| DbError::NoAnswer { waited: limit })??;
        let Some(password) = password else {
            return Err(DbError::HandlerMigration(format!(
                "handler {handler} has no database login yet: it is made when the handler is \
                 prepared (at start, at upload, or by `inboxd migrate`)"
            )));
        };
        let options = self
            .base
            .clone()
            .username(&handler_role(handler))
            .password(&password)
            .application_name(&format!("inboxd:{handler}"))
            // What a session keeps prepared is held in its backend: see
            // `sandbox::postgres::plan_cache`.
            .statement_cache_capacity(crate::sandbox::postgres::plan_cache::KEPT_STATEMENTS)
            .options([
                (
                    "search_path",
                    format!("{},{HANDLER_SEARCH_PATH_TAIL}", handler_schema(handler)),
                ),
                ("lock_timeout", format!("{}ms", HOST_LOCK_TIMEOUT.as_millis())),
                // A sort's comparisons run without an interrupt check, over
                // what fits in work_mem: PostgreSQL's default, whatever the
                // server's, bounds them (see `sandbox::work`).
                ("work_mem", GUEST_WORK_MEM.to_owned()),
                // A custom plan puts the parameters' values into the
                // statement and evaluates its calls over them while planning,
                // every row of a VALUES list at once, with no interrupt check
                // (an adversarial read, issue 23: 2,000 rows of md5($1) ran
                // 5 s past a cancel). A generic plan evaluates them as it
                // executes, where PostgreSQL checks between rows; the work
                // bound counts only literals as folded (`sandbox::work`).
                ("plan_cache_mode", "force_generic_plan".to_owned()),
                // Regression (the eighteenth adversarial read, issue 23):
                // compiling a plan to native code checks for no interrupt;
                // a 3,000-arm CASE ran 14.7 s past a 1 s statement_timeout,
                // and 15,000 arms ignored cancel and terminate for minutes.
                ("jit", "off".to_owned()),
                // A hash join whose rows all share one key cannot split into
                // batches, so it grows past work_mem without bound (2 GB
                // from 2,000 rows after `UPDATE t SET k = 0`, until the
                // kernel kills the backend and PostgreSQL restarts every
                // team's sessions). Merge and nested-loop joins spill.
                ("enable_hashjoin", "off".to_owned()),
                // A hash aggregate checks its memory only when it makes a
                // new group, so `max($1)` over a few hundred small groups
                // grew each one to 1 MiB: 512 MB in one backend (the review
                // of the eighteenth read). Sorted grouping holds one group's
                // state at a time, and its sort spills.
                ("enable_hashagg", "off".to_owned()),
                // Regression (the twentieth adversarial read, issue 23): the
                // exhaustive join search keeps every join of every subset of
                // its relations, with their paths and copied clauses; 11
                // tables (one below the default threshold) planned in 1.3 GB.
                // The genetic search frees each try: the same join planned in
                // 0.2 s and 21 MB. The collapse limits keep each search that
                // small whatever the server says.
                ("geqo", "on".to_owned()),
                ("geqo_threshold", GUEST_GEQO_THRESHOLD.to_string()),
                ("join_collapse_limit", GUEST_GEQO_THRESHOLD.to_string()),
                ("from_collapse_limit", GUEST_GEQO_THRESHOLD.to_string()),
                // Parallel workers each take their own work_mem and a core:
                // one statement's share must stay one backend's.
                ("max_parallel_workers_per_gather", "0".to_owned()),
                // So does building an index: one backend's share stays one.
                ("max_parallel_maintenance_workers", "0".to_owned()),
                // A backend whose client is gone (the host gave up on a
                // statement past its round-trip bound, see `tx::round_trip`)
                // learns it only when it next writes, which a long statement
                // never does: a migration ran on 45 s after the host left.
                // PostgreSQL then looks every second, and ends the statement.
                ("client_connection_check_interval", "1000".to_owned()),
                // Regression (the nineteenth adversarial read, issue 23):
                // both of the guard's parsers read '\' as a backslash; a
                // server (its config, a database's or a role's setting)
                // with standard_conforming_strings off reads it as an
                // escaped quote, and the rest of the statement as SQL
                // neither parser saw. The lexer's settings are the guard's.
                ("standard_conforming_strings", "on".to_owned()),
                ("backslash_quote", "off".to_owned()),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .min_connections(0)
            .acquire_timeout(super::ACQUIRE_TIMEOUT)
            .max_lifetime(GUEST_SESSION_LIFETIME)
            // As the host's pool: only a connection idle for a while is pinged.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= super::PING_IF_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .after_release(|conn, _| {
                Box::pin(async move {
                    let row = conn.fetch_all(RESET_SESSION).await?.pop();
                    let prepared: i64 = row.map_or(Ok(0), |r| r.try_get(1))?;
                    // `false` closes the connection: a name the guest
                    // prepared could collide with the driver's own.
                    Ok(prepared == 0)
                })
            })
            .connect_lazy_with(options);
        let mut pools = self.lock();
        Ok(pools.entry(handler.to_owned()).or_insert(pool).clone())
    }

    /// Forgets a handler's pool (its login changed), closing it in the background.
    pub fn forget(&self, handler: &str) {
        if let Some(pool) = self.lock().remove(handler) {
            tokio::spawn(async move { pool.close().await });
        }
    }

    pub async fn close(&self) {
        let pools: Vec<PgPool> = self.lock().drain().map(|(_, p)| p).collect();
        for pool in pools {
            pool.close().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PgPool>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a handler's connection lives before the pool closes it and opens
/// another. A backend keeps caches no SQL can empty and no reset reaches:
/// every time zone it parsed, every anonymous row type it met (the
/// forty-second adversarial read: 480 MB and 208 MB left behind, past
/// `DISCARD ALL`). The guard keeps statements from filling them fast; this
/// bounds how long whatever they hold outlives the events that made it.
const GUEST_SESSION_LIFETIME: Duration = Duration::from_secs(60);

/// How long a statement of the host's may wait for a lock inside a handler's
/// transaction: a handler's statement abandoned at its deadline may still
/// hold the rows it locked, and the event's next attempt must fail (and back
/// off) rather than wait on them forever.
pub const HOST_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    /// A handler's transactions are bounded across every pool it has had:
    /// forgetting its pool (a renewed login) frees no permit.
    #[tokio::test]
    async fn a_handler_runs_at_most_max_connections_transactions_whatever_its_pools() {
        let pools = GuestPools::new(PgConnectOptions::new(), 2);
        let wait = Duration::from_millis(20);
        let first = pools.transaction_permit("h", wait).await.unwrap();
        let _second = pools.transaction_permit("h", wait).await.unwrap();
        pools.forget("h");
        assert!(pools.transaction_permit("h", wait).await.is_none());
        assert!(pools.transaction_permit("other", wait).await.is_some());
        drop(first);
        assert!(pools.transaction_permit("h", wait).await.is_some());
    }
}
