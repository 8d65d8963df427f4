//! `inboxd:handler/sql`: a guest's statements, on the host's open transaction.
//!
//! The transaction is moved in for the call and taken back after it; the
//! guest never sees a connection, so it cannot begin, commit or roll back.
//! Every statement passes the statement guard and the per-event limits first
//! (statements, parameters, time left), and the database stops it at the
//! event's deadline. Refusals and database errors come back to the guest as
//! typed `sql-error` values and count against the handler; only a failure of
//! the database itself (the connection, the server) is kept for the host.

use crate::bindings::{SqlDialect, SqlError, Value, sql_api};
use crate::db::{Backend, DbError, SqlValue, Tx};
use crate::handler::Limits;
use crate::sandbox::guard::Approved;
use crate::sandbox::work::json_keys;
use crate::sandbox::{Guard, Refusal};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::HasData;

/// Parameters one statement may bind. SQLite's default ceiling is 32,766 and
/// PostgreSQL's wire protocol counts them in 16 bits: past these the driver
/// fails in ways that look like the connection's fault, so the guest is told first.
const MAX_PARAMS: usize = 32_766;

pub struct SqlState {
    tx: Option<Tx>,
    backend: Backend,
    guard: Arc<Guard>,
    statements_left: u32,
    max_statements: u32,
    max_rows: usize,
    max_result_bytes: usize,
    /// The event's deadline: no statement starts after it.
    deadline: Instant,
    timeout: Duration,
    /// A statement was stopped at the event's deadline: the event ran out of
    /// time, whatever the guest made of the error.
    timed_out: bool,
    /// A statement ran out of SQLite's shared heap or temporary disk (the
    /// resource and what was said): like the deadline, the limit failed
    /// whatever the guest made of it.
    exhausted: Option<(&'static str, String)>,
    /// A failure of the database itself (connection lost, server restarting)
    /// during a guest statement. It is the host's to retry, never counted
    /// against the handler, whatever the guest made of its error value.
    host_error: Option<DbError>,
    /// A statement was sent and has not come back: still true if the call
    /// was dropped while it ran (the host's backstop), so the host knows
    /// the connection may be busy with it.
    statement_running: bool,
}

impl SqlState {
    /// How many statements the guest ran for this event.
    pub fn statements_run(&self) -> u32 {
        self.max_statements - self.statements_left
    }

    pub fn new(tx: Tx, guard: Arc<Guard>, limits: &Limits) -> Self {
        let backend = tx.backend();
        Self {
            tx: Some(tx),
            backend,
            guard,
            statements_left: limits.max_statements,
            max_statements: limits.max_statements,
            max_rows: limits.max_rows,
            max_result_bytes: limits.max_result_bytes,
            deadline: Instant::now() + limits.timeout,
            timeout: limits.timeout,
            timed_out: false,
            exhausted: None,
            host_error: None,
            statement_running: false,
        }
    }

    /// No statement starts after `deadline`: the call's own, when it has
    /// less than the handler's timeout left (a call run again).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    /// Takes the transaction back after the call. `None` only if a call was
    /// cancelled mid-statement, in which case the transaction is gone.
    pub fn take_tx(&mut self) -> Option<Tx> {
        self.tx.take()
    }

    /// True if a statement of this call ran into the event's deadline.
    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    /// The shared resource a statement of this call exhausted (SQLite's heap
    /// or its temporary disk) and what was said, if one did.
    pub fn exhausted(&self) -> Option<(&'static str, &str)> {
        self.exhausted.as_ref().map(|(what, said)| (*what, said.as_str()))
    }

    pub fn take_host_error(&mut self) -> Option<DbError> {
        self.host_error.take()
    }

    /// True if the call ended (was dropped) while one of its statements ran.
    pub fn statement_running(&self) -> bool {
        self.statement_running
    }
}

pub struct SqlCap;

impl HasData for SqlCap {
    type Data<'a> = SqlView<'a>;
}

pub struct SqlView<'a> {
    pub state: &'a mut SqlState,
}

fn to_sql(value: Value) -> SqlValue {
    match value {
        Value::Null => SqlValue::Null,
        Value::Int64(v) => SqlValue::Int64(v),
        Value::Float64(v) => SqlValue::Float64(v),
        Value::Text(v) => SqlValue::Text(v),
        Value::Blob(v) => SqlValue::Blob(v),
        Value::Boolean(v) => SqlValue::Boolean(v),
    }
}

fn to_wit(value: SqlValue) -> Value {
    match value {
        SqlValue::Null => Value::Null,
        SqlValue::Int64(v) => Value::Int64(v),
        SqlValue::Float64(v) => Value::Float64(v),
        SqlValue::Text(v) => Value::Text(v),
        SqlValue::Blob(v) => Value::Blob(v),
        SqlValue::Boolean(v) => Value::Boolean(v),
    }
}

/// Maps a database error to the variant that tells the guest what to do.
fn to_sql_error(err: &DbError, timeout: Duration) -> SqlError {
    match err {
        DbError::StatementMemory { .. } | DbError::StatementSpill => SqlError::Limit(err.to_string()),
        DbError::StatementTimeout => SqlError::Limit(format!(
            "limits.timeout_ms: the statement was still running at the event's deadline ({} ms) and was cancelled",
            timeout.as_millis()
        )),
        DbError::Sqlx(sqlx::Error::Database(db)) => {
            let message = db.message().to_owned();
            match db.kind() {
                sqlx::error::ErrorKind::UniqueViolation
                | sqlx::error::ErrorKind::ForeignKeyViolation
                | sqlx::error::ErrorKind::NotNullViolation
                | sqlx::error::ErrorKind::CheckViolation => SqlError::Constraint(message),
                // The second wall (a role without privileges, the SQLite
                // authorizer) refused what the guard let through.
                _ if ["permission denied", "not authorized", "prohibited"]
                    .iter()
                    .any(|m| message.contains(m)) =>
                {
                    SqlError::Forbidden(message)
                }
                _ => SqlError::Database(message),
            }
        }
        DbError::TooManyRows { .. } | DbError::ResultTooLarge { .. } => SqlError::Limit(err.to_string()),
        DbError::Decode(_) | DbError::Sqlx(sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)) => {
            SqlError::Invalid(err.to_string())
        }
        _ => SqlError::Database(err.to_string()),
    }
}

/// Bytes of a statement's parameters the host scanned on this worker, and
/// a turn for the runtime's other tasks after each [`Scanned::TURN`] of
/// them. Counted over all the parameters, not per parameter: a guest's
/// 8,000 parameters of 64 KiB each (aliases of one buffer) were a half
/// second of the worker with no turn between (the forty-ninth read).
#[derive(Default)]
struct Scanned(usize);

impl Scanned {
    const TURN: usize = 1 << 20;

    async fn add(&mut self, bytes: usize) {
        self.0 += bytes;
        if self.0 >= Self::TURN {
            self.0 = 0;
            tokio::task::yield_now().await;
        }
    }
}

impl SqlView<'_> {
    /// The walls before any statement: the event's deadline, the per-event
    /// statement budget, the parameters' count and sizes, then the guard.
    async fn admit(&mut self, statement: &str, params: &[Value]) -> Result<Approved, SqlError> {
        if self.state.host_error.is_some() {
            return Err(SqlError::Database(
                "the database connection failed; the host will retry this event".into(),
            ));
        }
        if Instant::now() >= self.state.deadline {
            self.state.timed_out = true;
            return Err(SqlError::Limit(format!(
                "limits.timeout_ms: the event's {} ms are used up",
                self.state.timeout.as_millis()
            )));
        }
        if params.len() > MAX_PARAMS {
            return Err(SqlError::Limit(format!(
                "the statement binds {} parameters; at most {MAX_PARAMS} are allowed",
                params.len()
            )));
        }
        if self.state.statements_left == 0 {
            return Err(SqlError::Limit(format!(
                "limits.max_statements: this event already ran {} statements",
                self.state.max_statements
            )));
        }
        // Counted before the parameters are scanned (the tenth read).
        self.state.statements_left -= 1;
        let max_row_bytes = self.state.guard.max_row_bytes();
        let mut scanned = Scanned::default();
        for (i, param) in params.iter().enumerate() {
            // As text: what the statement guard counts it at (`sandbox::work`).
            let bytes = match param {
                Value::Text(text) => text.len(),
                Value::Blob(blob) => blob.len().saturating_mul(2),
                _ => 0,
            };
            if bytes > max_row_bytes {
                return Err(SqlError::Limit(format!(
                    "limits.max_row_bytes: parameter {} is {bytes} bytes as text (a blob counts twice, as \
                     hex); the limit is {max_row_bytes}",
                    i + 1
                )));
            }
            // A text PostgreSQL may read as json/jsonb: its objects' keys
            // are sorted without interruption (`sandbox::work::json_keys`).
            if let (Value::Text(text), Backend::Postgres) = (param, self.state.guard.backend())
                && text.trim_start().starts_with(['{', '['])
            {
                json_keys::check(text, &format!("parameter {}", i + 1))
                    .map_err(|refusal| SqlError::Limit(refusal.to_string()))?;
                scanned.add(text.len()).await;
            }
        }
        let verdict = match self.state.guard.remembered(statement) {
            Some(verdict) => verdict,
            // A text the guard has not judged: parsed on a blocking thread,
            // so no runtime worker (and no other handler's event on it) waits.
            None => {
                let (guard, statement) = (self.state.guard.clone(), statement.to_owned());
                // Held by the judge itself: a call dropped at its backstop
                // leaves its judge running, and its turn taken until it ends.
                let turn = self.state.guard.judges().acquire_owned().await;
                tokio::task::spawn_blocking(move || {
                    let _turn = turn;
                    guard.approve(&statement)
                })
                .await
                .unwrap_or_else(|_| {
                    Err(Refusal::Forbidden(
                        "the statement guard failed on this statement (a defect of the host); it was \
                             not run"
                            .into(),
                    ))
                })
            }
        };
        let approved = verdict.map_err(|refusal| match refusal {
            Refusal::Forbidden(m) => SqlError::Forbidden(m),
            Refusal::Limit(m) => SqlError::Limit(m),
        })?;
        // PostgreSQL keeps every time zone a session reads for as long as
        // it lives (`sandbox::postgres::zones`): a parameter read as a date
        // or time may not name one as a POSIX rule.
        for &number in &approved.zoned_params {
            match params.get(number.wrapping_sub(1)) {
                Some(Value::Text(text)) if !crate::sandbox::postgres::zone_free(text) => {
                    return Err(SqlError::Forbidden(format!(
                        "parameter {number} is read as a date or time and names a time zone as a POSIX rule \
                         (letters going on to an offset: `abc+1`), which the database session would keep \
                         until it closes: give the offset as a number (`+02:00`, `Z`) or name a zone \
                         (`Europe/Paris`)"
                    )));
                }
                Some(Value::Text(text)) => scanned.add(text.len()).await,
                Some(Value::Null) | None => {}
                // Regression (the forty-fifth read): a blob cast to text on
                // its way to a date is its hex (`\x01ab02`), which PostgreSQL
                // reads as the zone rule `X01AB02`; a number's text (`1e+20`)
                // as `E+20`. Only text is checked, so only text is read.
                Some(_) => {
                    return Err(SqlError::Forbidden(format!(
                        "parameter {number} is read as a date or time, so it must be text (or null), \
                         which the host checks for time zones before binding it"
                    )));
                }
            }
        }
        Ok(approved)
    }

    fn tx(&mut self) -> Result<&mut Tx, SqlError> {
        self.state
            .tx
            .as_mut()
            .ok_or_else(|| SqlError::Database("the event's transaction is no longer open".into()))
    }

    /// Turns a database error into the guest's error value, keeping failures
    /// of the database itself for the host. Anything else a statement caused
    /// (a bad parameter, a lock it waited on, a resource it exhausted) is the
    /// guest's: it counts against the handler's attempts, never as an endless
    /// host retry.
    fn fail(&mut self, error: DbError) -> SqlError {
        let guest_error = to_sql_error(&error, self.state.timeout);
        self.state.timed_out |= matches!(error, DbError::StatementTimeout);
        match error {
            DbError::StatementMemory { .. } => {
                self.state.exhausted = Some(("SQLite's heap", error.to_string()))
            }
            DbError::StatementSpill => {
                self.state.exhausted = Some(("SQLite's temporary disk", error.to_string()))
            }
            _ => {}
        }
        if error.is_connection_failure() {
            self.state.host_error = Some(error);
        }
        guest_error
    }
}

impl sql_api::Host for SqlView<'_> {
    async fn dialect(&mut self) -> SqlDialect {
        match self.state.backend {
            Backend::Sqlite => SqlDialect::Sqlite,
            Backend::Postgres => SqlDialect::Postgres,
        }
    }

    async fn execute(&mut self, statement: String, params: Vec<Value>) -> Result<u64, SqlError> {
        let approved = self.admit(&statement, &params).await?;
        let params: Vec<SqlValue> = params.into_iter().map(to_sql).collect();
        self.tx()?.set_ctes(approved.ctes);
        self.state.statement_running = true;
        let done = self
            .tx()?
            .guest_execute_approved(
                &statement,
                &params,
                approved.insert.as_ref(),
                approved.keep_prepared,
            )
            .await;
        self.state.statement_running = false;
        match done {
            Ok(changed) => Ok(changed),
            Err(error) => Err(self.fail(error)),
        }
    }

    async fn query(&mut self, statement: String, params: Vec<Value>) -> Result<Vec<Vec<Value>>, SqlError> {
        let approved = self.admit(&statement, &params).await?;
        let params: Vec<SqlValue> = params.into_iter().map(to_sql).collect();
        let (max_rows, max_bytes) = (self.state.max_rows, self.state.max_result_bytes);
        self.tx()?.set_ctes(approved.ctes);
        self.state.statement_running = true;
        let done = self
            .tx()?
            .guest_query_approved(&statement, &params, max_rows, max_bytes, approved.keep_prepared)
            .await;
        self.state.statement_running = false;
        let rows = match done {
            Ok(rows) => rows,
            Err(error) => return Err(self.fail(error)),
        };
        Ok(rows
            .into_iter()
            .map(|row| row.into_iter().map(to_wit).collect())
            .collect())
    }
}
