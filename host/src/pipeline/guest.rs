//! One guest call on an open transaction: the sequence every caller shares.
//!
//! The pipeline (an event alone, or one of a batch) and a dead letter's
//! replay both run a handler through [`call`]: check the payload bound, put
//! the savepoint and the handler's walls up, invoke, take the transaction
//! back, take the walls down, and sort what came back into the host's
//! failures (an `Err`: nothing is counted against the handler, the caller
//! retries) and the guest's ([`Call::Failed`]). Writing the outbox and the
//! invariant check stay with the caller: a batch does them once for all its
//! events.

use super::PipelineError;
use crate::db::outbox::NewMessage;
use crate::db::{DbError, Tx};
use crate::handler::{GuestFailure, Handler};
use crate::record::Record;
use std::time::{Duration, Instant};

/// The savepoint around a handler's statements: a failed handler is undone
/// without losing the claim (or the batch's other events).
const GUEST_SAVEPOINT: &str = "inboxd_guest";

/// What a guest call came to, for the guest.
pub enum Call {
    /// It succeeded; its writes are in the transaction, and these messages
    /// must be written to the outbox before it commits.
    Applied(Vec<NewMessage>),
    /// It failed; its writes were undone and the claim stays.
    Failed(GuestFailure),
    /// Its payload is past `limits.max_payload_bytes`: it was not run.
    TooLarge(String),
    /// It failed, or one of its statements did, inside a savepoint shared
    /// with earlier calls ([`Tx::share_guest_savepoint`]): undoing it undid
    /// them too. Nothing is counted; the caller rolls the transaction back
    /// and runs its events again one savepoint each, where this call's
    /// outcome is decided (and counted).
    Redo,
    /// Not run: another event with its business key was applied inside the
    /// handler's dedup window (`[handlers.dedup]`). Its claim stays.
    DuplicateByKey,
}

impl Call {
    /// What the call came to, in a word (a span's `outcome`).
    pub fn outcome(&self) -> &'static str {
        match self {
            Call::Applied(_) => "applied",
            Call::Failed(GuestFailure::Retry(_)) => "retry",
            Call::Failed(GuestFailure::Reject(_)) => "reject",
            Call::Failed(GuestFailure::Trap(_)) => "trap",
            Call::Failed(GuestFailure::Limit(_)) => "limit",
            Call::TooLarge(_) => "too-large",
            Call::Redo => "redo",
            Call::DuplicateByKey => "duplicate-by-key",
        }
    }
}

/// The transaction, handed back, and what happened in it.
pub struct Called {
    pub tx: Tx,
    pub call: Call,
    /// SQLite rolled the whole transaction back under the guest (a write
    /// stopped at its deadline): everything before the call in it is gone,
    /// and `tx` is a new, empty one.
    pub lost: bool,
    /// Time inside the handler's calls (both, if it ran twice).
    pub took: Duration,
}

/// Runs `handler` for `event_id`, claimed in `tx` by the caller. `spent`:
/// what this attempt of the event already ran in a transaction given up
/// (an optimistic batch's, [`Call::Redo`]). An attempt has the handler's
/// timeout in all, however often the host runs its call again: twice a
/// call's time was a handler's way to hold its instance and connection for
/// a multiple of its deadline (the forty-eighth read).
pub async fn call(
    handler: &dyn Handler,
    mut tx: Tx,
    record: &Record,
    event_id: &str,
    attempt: u32,
    spent: Duration,
) -> Result<Called, PipelineError> {
    let max_payload = handler.max_payload_bytes();
    let too_large = match record.cut {
        // Even if this version's limit is higher: the rest was never read.
        Some(cut) => Some(cut.reason()),
        None if record.payload.len() > max_payload => Some(format!(
            "limit limits.max_payload_bytes exceeded: the payload is {} bytes; the limit is {max_payload}",
            record.payload.len()
        )),
        None => None,
    };
    if let Some(reason) = too_large {
        return Ok(Called {
            tx,
            call: Call::TooLarge(reason),
            lost: false,
            took: Duration::ZERO,
        });
    }
    tx.enter_guest(GUEST_SAVEPOINT, handler.walls()).await?;
    tx.set_statement_savepoints(false);
    let started = Instant::now();
    let budget = handler.timeout().saturating_sub(spent);
    let mut invocation = handler.invoke(tx, record, event_id, attempt, budget).await;
    let mut took = started.elapsed();
    let mut tx = invocation.tx.take().ok_or(PipelineError::LostTransaction)?;
    let out_of_time = matches!(invocation.result, Err(GuestFailure::Limit(_)));
    let statement_failed = tx.take_statement_failed();
    let shared = tx.shares_guest_savepoint();
    if shared && invocation.host_error.is_none() && (statement_failed || invocation.result.is_err()) {
        // Rolling back to the savepoint undid the earlier calls that share
        // it as well: the caller starts over, one savepoint per call.
        tx.exit_guest(GUEST_SAVEPOINT, false).await?;
        let lost = tx.take_lost();
        return Ok(Called {
            tx,
            call: Call::Redo,
            lost,
            took,
        });
    }
    if statement_failed && invocation.host_error.is_none() && !out_of_time {
        // A statement failed without its own savepoint, which aborts the
        // transaction on PostgreSQL: undo the call and run it again with
        // one, as if it had been that way from the start. (Not after a
        // limit: the same call would only run into it again.)
        tracing::debug!(
            handler = handler.name(),
            event_id,
            "re-running with statement savepoints"
        );
        tx.exit_guest(GUEST_SAVEPOINT, false).await?;
        tx.release(GUEST_SAVEPOINT).await?;
        tx.enter_guest(GUEST_SAVEPOINT, handler.walls()).await?;
        tx.set_statement_savepoints(true);
        let again = Instant::now();
        let budget = budget.saturating_sub(took);
        invocation = handler.invoke(tx, record, event_id, attempt, budget).await;
        took += again.elapsed();
        tx = invocation.tx.take().ok_or(PipelineError::LostTransaction)?;
    }
    let succeeded = invocation.result.is_ok() && invocation.host_error.is_none();
    let exited = tx.exit_guest(GUEST_SAVEPOINT, succeeded).await;
    if let Some(error) = invocation.host_error {
        // Dropping the transaction rolls it back; the caller retries.
        return Err(error.into());
    }
    exited?;
    let lost = tx.take_lost();
    let call = match invocation.result {
        // Never committed as applied: what the call did went with the
        // transaction (a component reports this as a host error first).
        Ok(()) if lost => return Err(DbError::TransactionLost.into()),
        Ok(()) => Call::Applied(invocation.outbox),
        Err(failure) => Call::Failed(failure),
    };
    Ok(Called { tx, call, lost, took })
}
