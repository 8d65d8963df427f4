//! The wasmtime `Engine`, its epoch ticker, and the shared `Linker`.
//!
//! One engine per host process: compiled components and the linker are tied
//! to it, and one ticker thread drives every store's time limit.

use super::limits::EPOCH_TICK;
use super::state::StoreState;
use crate::bindings::{log_api, outbox_api, sql_api, types_api};
use crate::capabilities::{log, outbox, sql};
use std::path::PathBuf;
use std::sync::Arc;
use wasmtime::component::Linker;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

#[derive(Clone)]
pub struct WasmEngine {
    pub(crate) engine: Engine,
    pub(crate) linker: Arc<Linker<StoreState>>,
    /// Where compiled components are cached (`None`: compile at every load).
    pub(crate) cache_dir: Option<PathBuf>,
}

impl WasmEngine {
    pub fn new(cache_dir: Option<PathBuf>) -> wasmtime::Result<Self> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        // Epoch interruption, not fuel: it costs a load and compare at loop
        // heads instead of counting every instruction.
        config.epoch_interruption(true);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling()));
        let engine = Engine::new(&config)?;
        spawn_epoch_ticker(&engine);
        let mut linker = Linker::new(&engine);
        add_to_linker(&mut linker)?;
        Ok(Self {
            engine,
            linker: Arc::new(linker),
            cache_dir,
        })
    }
}

/// WASI (with the empty context built per store) and Inboxd's interfaces:
/// the only imports a guest can be linked against.
fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    types_api::add_to_linker::<_, log::LogCap>(linker, |s| log::LogView { state: &mut s.log })?;
    log_api::add_to_linker::<_, log::LogCap>(linker, |s| log::LogView { state: &mut s.log })?;
    sql_api::add_to_linker::<_, sql::SqlCap>(linker, |s| sql::SqlView { state: &mut s.sql })?;
    outbox_api::add_to_linker::<_, outbox::OutboxCap>(linker, |s| outbox::OutboxView {
        state: &mut s.outbox,
    })?;
    Ok(())
}

/// Every event gets a fresh instance (unless `instances.reuse`), so
/// instantiation is on the hot path.
/// The pooling allocator keeps linear memories, tables and stacks mapped in
/// slots that are reused, instead of an mmap, guard pages and an munmap (with
/// its cross-core TLB shootdown) per event. Instances at once are bounded by
/// the database pool (a guest only runs inside a transaction), far below these.
fn pooling() -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(256)
        // A Python component holds about 14 core instances (design §7).
        .total_core_instances(1024)
        .total_memories(256)
        .total_tables(512)
        .total_stacks(256)
        // Resetting a slot for the next instance is the largest cost of a
        // fresh instance per event. Without the scan, wasmtime memsets the
        // whole kept-resident prefix (with 1 MiB: 18% of the host's CPU on a
        // backlog, measured) and madvises the rest, whose page faults and
        // TLB shootdowns come back with the next instance. With PAGEMAP_SCAN
        // (Linux 6.7+) only the pages the guest dirtied are reset, in place
        // up to the bound, and clean pages stay mapped.
        .max_unused_warm_slots(16);
    if PoolingAllocationConfig::is_pagemap_scan_available() {
        pool.pagemap_scan(Enabled::Yes)
            .linear_memory_keep_resident(KEEP_RESIDENT_SCANNED)
            .table_keep_resident(TABLE_KEEP_RESIDENT);
    } else {
        pool.linear_memory_keep_resident(KEEP_RESIDENT_MEMSET);
    }
    pool
}

/// With the scan: dirty linear memory reset in place per slot (past it,
/// `madvise`). Only dirtied pages cost anything, so the bound can be generous.
const KEEP_RESIDENT_SCANNED: usize = 4 << 20;
/// Without it every instance pays a memset of all of this, dirty or not.
const KEEP_RESIDENT_MEMSET: usize = 1 << 20;
/// Tables are small (function references); with the scan, reset in place too.
const TABLE_KEEP_RESIDENT: usize = 64 << 10;

/// Advances the engine's epoch every [`EPOCH_TICK`] until the engine is dropped.
fn spawn_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("inboxd-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .expect("spawning the epoch ticker thread");
}
