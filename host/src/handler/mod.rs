//! What the pipeline runs for each fresh event, and what a call leaves behind.
//!
//! This is the seam between the pipeline (which owns the transaction) and
//! the code that runs inside it: the [`Handler`] trait, the [`Invocation`]
//! it hands back, a guest's [`GuestFailure`]s and its [`Limits`].
//!
//! In production a handler is always a sandboxed WebAssembly component
//! ([`crate::wasm::HandlerComponent`]). The trait lets the benchmark (and the
//! pipeline's own tests) put a native Rust handler through the very same
//! pipeline; a native handler gets the same open transaction and none of the
//! walls, so it is never loaded from configuration.

mod failure;
mod limits;

pub use failure::{GuestFailure, LimitExceeded};
pub use limits::Limits;

use crate::db::outbox::NewMessage;
use crate::db::{DbError, Tx, Walls};
use crate::record::Record;
use futures_util::future::BoxFuture;
use std::time::Duration;

pub trait Handler: Send + Sync {
    fn name(&self) -> &str;

    /// Recorded on each inbox row and dead letter as `handler_version`: the
    /// upload number of an uploaded version, else the first 12 hex digits of
    /// the component's SHA-256.
    fn version_label(&self) -> &str;

    /// Larger payloads are dead-lettered without running the handler.
    fn max_payload_bytes(&self) -> usize;

    /// What its SQL may touch and for how long: the pipeline puts these up
    /// around every call.
    fn walls(&self) -> &Walls;

    /// Runs the handler for one event inside `tx` (already inside its
    /// [`Handler::walls`] and a savepoint) and hands `tx` back. `budget`:
    /// the time the call may take, the handler's timeout less what this
    /// attempt of the event already ran (see `pipeline::guest::call`).
    fn invoke<'a>(
        &'a self,
        tx: Tx,
        record: &'a Record,
        event_id: &'a str,
        attempt: u32,
        budget: Duration,
    ) -> BoxFuture<'a, Invocation>;

    /// The time one event may run in one attempt (`limits.timeout_ms`).
    fn timeout(&self) -> Duration;
}

/// What one guest call left behind.
pub struct Invocation {
    /// The event's transaction, handed back; `None` only if the call had to be
    /// abandoned mid-statement.
    pub tx: Option<Tx>,
    pub result: Result<(), GuestFailure>,
    /// The database itself failed under the guest: the host's problem, whatever `result` says.
    pub host_error: Option<DbError>,
    /// Messages the guest published; written only if its work commits.
    pub outbox: Vec<NewMessage>,
}
