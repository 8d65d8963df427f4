//! The data of one guest invocation's `Store`.
//!
//! A store normally lives for exactly one event: it is created with the
//! event's open transaction moved in, and dropped (with the instance and all
//! guest memory) when the call returns, so nothing a guest does survives into
//! the next event except what it committed through `sql`. With
//! `instances.reuse` a store and its instance serve several events in turn
//! ([`StoreState::next_event`]); a trap or a limit still ends them.

use super::limits::MemoryLimiter;
use super::output::GuestOutput;
use crate::capabilities::log::{LogState, LogTag};
use crate::capabilities::outbox::OutboxState;
use crate::capabilities::sql::SqlState;
use crate::db::Tx;
use crate::handler::Limits;
use crate::sandbox::Guard;
use std::sync::Arc;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// WASI resources (streams, pollables, ...) a store may hold at once. Each
/// is host memory the guest's `memory_mb` does not count (the default,
/// 1,000,000, let one event hold 99,000 stdout streams, 70 MB); the guests
/// hold a handful.
pub(crate) const MAX_RESOURCES: usize = 10_000;

/// The most bytes one `wasi:random` call returns (a guest wanting more
/// calls again: each call is a host call, counted and interruptible between).
const MAX_RANDOM_BYTES: u64 = 64 * 1024;

pub struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    pub(crate) sql: SqlState,
    pub(crate) outbox: OutboxState,
    pub(crate) log: LogState,
    pub(crate) stdout: GuestOutput,
    pub(crate) stderr: GuestOutput,
    /// When the running event's guest is stopped (see `HandlerComponent`'s
    /// epoch callback).
    pub(crate) deadline: std::time::Instant,
}

impl StoreState {
    pub fn new(
        tx: Tx,
        guard: Arc<Guard>,
        limits: &Limits,
        outbox: OutboxState,
        tag: Arc<LogTag>,
        event_id: String,
    ) -> Self {
        let stdout = GuestOutput::new(limits.output_bytes);
        let stderr = GuestOutput::new(limits.output_bytes);
        // No preopened directories, environment, arguments or network: the
        // builder's defaults plus explicit refusals, so a future default change
        // in wasmtime-wasi cannot widen a guest's reach.
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            // wasi:random fills a buffer of the guest's asking in one
            // synchronous call, outside the guest's memory and its epoch
            // deadline: 64 MiB by default (the ninth read of this round).
            .max_random_size(MAX_RANDOM_BYTES)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        Self {
            wasi,
            table,
            limiter: MemoryLimiter::new(limits.memory_bytes),
            sql: SqlState::new(tx, guard, limits),
            outbox,
            log: LogState::new(tag, event_id, limits.output_bytes),
            stdout,
            stderr,
            deadline: std::time::Instant::now() + limits.timeout,
        }
    }
}

impl StoreState {
    /// Readies a reused store for its next event: a new transaction, outbox,
    /// statement budget and log budget; the guest's memory stays as it was.
    pub fn next_event(
        &mut self,
        tx: Tx,
        guard: Arc<Guard>,
        limits: &Limits,
        outbox: OutboxState,
        tag: Arc<LogTag>,
        event_id: String,
    ) {
        self.sql = SqlState::new(tx, guard, limits);
        self.outbox = outbox;
        self.log = LogState::new(tag, event_id, limits.output_bytes);
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
