//! A guest call that outlived its deadline with a statement still running:
//! on PostgreSQL its backend is terminated and the transaction replaced, on
//! SQLite the statement is interrupted and waited for inside its walls.

use super::{Inner, Tx};
use crate::db::{Backend, DbError};

/// How long the host waits for PostgreSQL to end the backend of a
/// statement it abandoned (`pg_terminate_backend`'s own timeout).
const TERMINATE_WAIT_MS: i64 = 1000;

impl Tx {
    /// A guest call that is stuck in a statement past every deadline (the
    /// database ignored `statement_timeout`): its session's backend is
    /// terminated, from the host's own pool (the host's login is a member of
    /// the handler's role, so it may), and the transaction is replaced by a
    /// new, empty one on a fresh connection, reported as lost (see
    /// [`Tx::take_lost`]): the caller redoes the other work of the
    /// transaction and counts the event's attempt as a time limit. `Err` if
    /// no new transaction could begin. On SQLite, see [`Tx::settle_stuck_call`].
    pub async fn abandon_stuck_call(&mut self) -> Result<(), DbError> {
        if self.backend() == Backend::Sqlite {
            return self.settle_stuck_call().await;
        }
        let (Some(session), Some(gate)) = (&self.session_of, &self.gate) else {
            return Err(DbError::TransactionLost);
        };
        // Only while that pid is still a session of the handler's role: a
        // pid the server gave to another connection since is left alone.
        let ended: Option<bool> = sqlx::query_scalar(
            "SELECT pg_catalog.pg_terminate_backend(pid, $2) FROM pg_catalog.pg_stat_activity \
             WHERE pid = $1 AND usename = $3",
        )
        .bind(session.pid)
        .bind(TERMINATE_WAIT_MS)
        .bind(crate::db::handler_role(&session.handler))
        .fetch_optional(&gate.host)
        .await
        .ok()
        .flatten();
        tracing::warn!(
            handler = session.handler,
            pid = session.pid,
            terminated = ?ended,
            "a handler's statement outlived its deadline and ignored the database's own timeout: \
             its backend was terminated and its transaction abandoned"
        );
        let fresh = session.pool.begin().await?;
        // The old transaction drops here; its connection, whose backend is
        // gone (or going), is closed when sqlx finds it broken.
        let within = match &self.inner {
            Inner::Postgres(_, within) => *within,
            Inner::Sqlite(_) => None,
        };
        self.inner = Inner::Postgres(fresh, within);
        self.deferred = None;
        let pid = self.backend_pid().await?;
        if let Some(session) = &mut self.session_of {
            session.pid = pid;
        }
        self.walls.mark_lost();
        Ok(())
    }

    /// SQLite: the guest call was dropped while its statement may still be
    /// running on sqlx's worker thread, inside the walls, which must stay up
    /// until it ends. Taking them down then (as leaving the call does) lifted
    /// the statement's deadline and allowlist while it ran: an adversarial
    /// read (issue 23) had a recursive query run on for good, holding the
    /// only writer. So the statement is interrupted, and the host waits for
    /// the worker to finish it (its next command runs after it) before anything
    /// else happens on the connection. An interrupted write takes the whole
    /// transaction with it, which is then replaced and reported as lost.
    async fn settle_stuck_call(&mut self) -> Result<(), DbError> {
        self.walls.interrupt_sqlite();
        if let Inner::Sqlite(tx) = &mut self.inner {
            drop(tx.lock_handle().await?);
        }
        tracing::warn!(
            "a handler's call outlived its deadline: any SQLite statement it was running was interrupted, \
             and waited for, inside its walls"
        );
        self.walls.after_failure(&mut self.inner).await.map(drop)
    }
}
