//! Part of [`Tx`], PostgreSQL: a shared guest call's plain INSERTs, held back and sent as
//! one multi-row statement (issue 24: one round trip per guest statement
//! was the largest part of the host's CPU).
//!
//! Only in an optimistic batch, where the events' calls share one savepoint
//! and any failure runs the whole batch again with a savepoint per call: a
//! held-back row that fails when sent fails the batch that way, and the rerun
//! sends every statement at once, where its error reaches its own event. The
//! rows go out in their order, only consecutive ones of the same text
//! together, and always inside the walls: before the call's next statement of
//! another kind, and before any statement of the host's.

use super::{Backend, DbError, SqlValue, Tx};
use crate::sandbox::postgres::PlainInsert;
use std::sync::Arc;

/// Rows held back at most: a statement of this many rows is sent at once.
const MAX_ROWS: usize = 64;
/// Parameter bytes held back at most (each parameter is at most
/// `limits.max_row_bytes`): past this the rows are sent, so the host never
/// holds more than a few statements' worth (regression, the eleventh
/// adversarial read: 64 rows of 100 MiB of parameters each).
const MAX_BYTES: usize = 4 << 20;
/// PostgreSQL's bound on the parameters of one statement.
const MAX_PARAMS: usize = 65_535;

/// Rows of one plain INSERT, not sent yet.
pub struct Deferred {
    /// The handler whose walls they are sent in (the text's tag).
    pub handler: String,
    text: String,
    insert: Arc<PlainInsert>,
    params: Vec<SqlValue>,
    rows: usize,
    bytes: usize,
}

impl Deferred {
    pub fn new(handler: &str, text: &str, insert: Arc<PlainInsert>) -> Self {
        Self {
            handler: handler.to_owned(),
            text: text.to_owned(),
            insert,
            params: Vec::new(),
            rows: 0,
            bytes: 0,
        }
    }

    /// True if `params` fill one row of `insert` exactly: any other count
    /// runs as it is, for PostgreSQL to refuse (regression, the eleventh
    /// read: too few panicked the host, too many shifted into the next row).
    pub fn fits(insert: &PlainInsert, params: &[SqlValue]) -> bool {
        params.len() == insert.params
    }

    /// True if a row of `text` may join these.
    pub fn takes(&self, handler: &str, text: &str) -> bool {
        self.handler == handler && self.text == text && (self.rows + 1) * self.insert.params <= MAX_PARAMS
    }

    pub fn push(&mut self, params: &[SqlValue]) {
        debug_assert!(Self::fits(&self.insert, params));
        self.params.extend_from_slice(params);
        self.bytes += params.iter().map(SqlValue::size).sum::<usize>();
        self.rows += 1;
    }

    /// True once the rows fill a statement of their own, or hold enough bytes.
    pub fn full(&self) -> bool {
        self.rows >= MAX_ROWS || (self.rows + 1) * self.insert.params > MAX_PARAMS || self.bytes >= MAX_BYTES
    }

    /// The statements that send them: the rows cut in powers of two, so a
    /// connection prepares at most seven texts per INSERT, each reused.
    pub fn statements(&self) -> Vec<(String, &[SqlValue])> {
        let mut out = Vec::new();
        let mut start = 0;
        let mut left = self.rows;
        while left > 0 {
            let rows = 1 << left.ilog2();
            let params = &self.params[start * self.insert.params..(start + rows) * self.insert.params];
            out.push((self.insert.text(rows), params));
            start += rows;
            left -= rows;
        }
        out
    }
}

impl Tx {
    /// The handler whose plain INSERTs may be held back now: a shared call,
    /// on PostgreSQL, without statement savepoints, nothing failed yet.
    pub(super) fn defers(&self) -> Option<String> {
        let shared = self.backend() == Backend::Postgres
            && self.walls.shares_savepoint()
            && !self.statement_savepoints
            && !self.statement_failed;
        shared
            .then(|| self.walls.handler_in_call().map(str::to_owned))
            .flatten()
    }

    /// Sends the rows held back, inside the walls they were written in; a
    /// failure is the call's (see [`Tx::take_statement_failed`]).
    pub(super) async fn send_in_call(&mut self) -> Result<(), DbError> {
        let result = self.send_deferred().await;
        if result.is_err() {
            self.statement_failed = true;
        }
        self.deadline_error(result).await
    }

    /// Before a statement of the host's: sends the rows held back, still
    /// inside the walls of the call that lingers. A failure belongs to one
    /// of the batch's calls, so the batch runs again call by call
    /// ([`DbError::DeferredFailed`]); unless the database or the network
    /// failed, which is no call's doing and goes up as it is.
    ///
    /// The rows run inside the lingering call's walls, so for as long as its
    /// `statement_timeout` allows, and the round trip is bounded by that (a
    /// host statement's bound alone, 15 s, gave up on 63 rows whose CHECKs a
    /// handler made slow under a 30 s timeout). And no answer in time is the
    /// batch's too: taken for the network's failure, the same held-back rows
    /// were sent again and again, for good (the twenty-fifth read). Run call
    /// by call, each row goes in its own call, under its deadline and its
    /// backstop; a network really gone fails there as an outage.
    pub(super) async fn send_before_host(&mut self) -> Result<(), DbError> {
        if self.deferred.is_none() {
            return Ok(());
        }
        if let Some(guest) = self.walls.statement_timeout_up() {
            self.bound_round_trips(guest);
        }
        let sent = self.send_deferred().await;
        self.bound_round_trips(std::time::Duration::ZERO);
        sent.map_err(|error| match error {
            DbError::NoAnswer { .. } => DbError::DeferredFailed(error.to_string()),
            error if error.is_connection_failure() => error,
            error => DbError::DeferredFailed(error.to_string()),
        })
    }

    async fn send_deferred(&mut self) -> Result<(), DbError> {
        let Some(deferred) = self.deferred.take() else {
            return Ok(());
        };
        for (text, params) in deferred.statements() {
            let kinds: String = params.iter().map(SqlValue::kind_letter).collect();
            let text = format!("/* {} {kinds} */ {text}", deferred.handler);
            // A long one is not kept (see `sandbox::postgres::plan_cache`).
            let keep = text.len() <= crate::sandbox::postgres::plan_cache::MAX_KEPT_TEXT_BYTES;
            self.inner.run(&text, params, keep).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_go_out_in_order_in_powers_of_two() {
        let insert = Arc::new(PlainInsert::of("INSERT INTO t (a) VALUES ($1)").unwrap());
        let mut d = Deferred::new("h", "INSERT INTO t (a) VALUES ($1)", insert);
        for i in 0..11 {
            d.push(&[SqlValue::Int64(i)]);
        }
        let sent: Vec<(usize, Vec<i64>)> = d
            .statements()
            .into_iter()
            .map(|(text, params)| {
                let rows = text.matches('(').count() - 1;
                let values = params
                    .iter()
                    .map(|p| match p {
                        SqlValue::Int64(v) => *v,
                        other => panic!("{other:?}"),
                    })
                    .collect();
                (rows, values)
            })
            .collect();
        assert_eq!(sent, vec![(8, (0..8).collect()), (2, vec![8, 9]), (1, vec![10])]);
        assert!(d.takes("h", "INSERT INTO t (a) VALUES ($1)"));
        assert!(!d.takes("h", "INSERT INTO t (b) VALUES ($1)"));
        assert!(!d.takes("other", "INSERT INTO t (a) VALUES ($1)"));
    }
}
