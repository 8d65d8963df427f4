//! A guest's statements in the host's transaction: each runs inside the
//! walls [`Tx::enter_guest`] put up, within its bound of rows and bytes and
//! its deadline, in a savepoint of its own where the backend needs one, and
//! never once the transaction was lost.

use super::*;

impl Tx {
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
    pub(super) async fn deadline_error<T>(&mut self, result: Result<T, DbError>) -> Result<T, DbError> {
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
}
