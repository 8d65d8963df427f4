//! What the pipeline runs for each fresh event.
//!
//! In production that is always a sandboxed WebAssembly component
//! ([`crate::wasm::HandlerComponent`]). The trait exists so the benchmark can
//! put a native Rust handler through the very same pipeline and measure what
//! the sandbox costs; a native handler gets the same open transaction and
//! none of the walls, so it is never loaded from configuration.

use crate::db::{Tx, Walls};
use crate::record::Record;
use crate::wasm::Invocation;
use futures_util::future::BoxFuture;

pub trait Handler: Send + Sync {
    fn name(&self) -> &str;

    /// Recorded on each inbox row and dead letter.
    fn version(&self) -> &str;

    /// Larger payloads are dead-lettered without running the handler.
    fn max_payload_bytes(&self) -> usize;

    /// What its SQL may touch and for how long: the pipeline puts these up
    /// around every call.
    fn walls(&self) -> &Walls;

    /// Runs the handler for one event inside `tx` (already inside its
    /// [`Handler::walls`] and a savepoint) and hands `tx` back.
    fn invoke<'a>(
        &'a self,
        tx: Tx,
        record: &'a Record,
        event_id: &'a str,
        attempt: u32,
    ) -> BoxFuture<'a, Invocation>;
}
