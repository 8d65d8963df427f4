//! The wasmtime `Engine`, its epoch ticker, and the shared `Linker`.
//!
//! One engine per host process: compiled components and the linker are tied
//! to it, and one ticker thread drives every store's time limit.

use super::compile_worker::CompileLimits;
use super::limits::EPOCH_TICK;
use super::state::StoreState;
use crate::bindings::{log_api, outbox_api, sql_api, types_api};
use crate::capabilities::{log, outbox, sql};
use crate::config::WasmConfig;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Semaphore;
use wasmtime::component::Linker;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

#[derive(Clone)]
pub struct WasmEngine {
    pub(crate) engine: Engine,
    pub(crate) linker: Arc<Linker<StoreState>>,
    /// Where compiled components are cached (`None`: compile at every load).
    pub(crate) cache_dir: Option<PathBuf>,
    /// What a compile worker may spend on one component.
    pub(crate) compile_limits: CompileLimits,
    /// One permit per component instance of the pool (see `super::warm`).
    pub(crate) slots: Arc<Semaphore>,
    instances: usize,
}

impl WasmEngine {
    pub fn new(wasm: &WasmConfig) -> wasmtime::Result<Self> {
        let mut config = compile_config();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(wasm.instances)));
        let engine = Engine::new(&config)?;
        spawn_epoch_ticker(&engine);
        let mut linker = Linker::new(&engine);
        add_to_linker(&mut linker)?;
        Ok(Self {
            engine,
            linker: Arc::new(linker),
            cache_dir: wasm.cache_dir(),
            compile_limits: CompileLimits::from(wasm),
            slots: Arc::new(Semaphore::new(wasm.instances as usize)),
            instances: wasm.instances as usize,
        })
    }

    /// The size of the instance pool (`wasm.instances`).
    pub fn instances(&self) -> usize {
        self.instances
    }
}

/// The settings that shape compiled code, shared by the host's engine and
/// the compile worker's (`super::compile_worker`): an artifact loads only
/// into an engine whose compile settings hash the same. The instance
/// allocator is not one of them, and the worker has no pool: it reserves
/// terabytes of address space, which `RLIMIT_AS` would refuse.
pub(crate) fn compile_config() -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    // Epoch interruption, not fuel: it costs a load and compare at loop
    // heads instead of counting every instruction.
    config.epoch_interruption(true);
    // Proposals no guest of ours needs, each more of the engine a hostile
    // component can reach (GC heaps, unwinding, 64-bit memories whose
    // bounds checks are explicit, shared memories): off, so a component
    // using one is refused when it loads, naming the feature.
    config
        .wasm_gc(false)
        .wasm_exceptions(false)
        .wasm_memory64(false)
        .wasm_threads(false)
        .wasm_shared_everything_threads(false)
        .wasm_stack_switching(false);
    config
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
/// its cross-core TLB shootdown) per event. Instances alive at once, running
/// or idle, take a permit of [`WasmEngine::slots`] first (see `super::warm`).
///
/// The slots are shared by every handler, so each component is capped
/// (checked when it is loaded, which refuses the upload) and each total is
/// its cap times the component instances (`wasm.instances`, 256 by
/// default): however many memories, tables or
/// core instances one team's component asks for, another team's instance
/// still finds its slots. Without the caps, one component of 256 core
/// instances, each with a memory, would take every memory slot while it
/// ran, and every other handler's instantiation would fail.
fn pooling(instances: u32) -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(instances)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .total_core_instances(instances * CORE_INSTANCES_PER_COMPONENT)
        .total_memories(instances * MEMORIES_PER_COMPONENT)
        .total_tables(instances * TABLES_PER_COMPONENT)
        .total_stacks(instances)
        // Resetting a slot for the next instance is the largest cost of a
        // fresh instance per event: wasmtime memsets this much of the memory
        // (and of each table) back, dirty or not, and madvises the rest away;
        // every page the guest dirties past it is faulted in again by the
        // next instance, with a TLB shootdown for the madvise (27%, 9% and 8%
        // of the host's CPU on a backlog, perf, issue 24). So it covers what
        // a Rust guest built with this repository's flags dirties: a 64 KiB
        // stack (`.cargo/config.toml`; rustc puts the stack first), its data
        // and the start of its heap. Measured side by side on mode (a):
        // billing.wasm with a 1 MiB stack and 64 KiB resident, 3.6 minor
        // faults and 236 µs of host CPU per event; with a 64 KiB stack and
        // 128 KiB resident, 0.1 faults and 167 µs.
        //
        // Not PAGEMAP_SCAN, which resets only the pages found dirty: in
        // wasmtime 48 a dirty page that was swapped out is neither reset nor
        // decommitted, so the next instance in the slot (another handler's,
        // maybe) could read it. A wall that depends on swap being off is not
        // a wall.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(KEEP_RESIDENT)
        .max_unused_warm_slots(16);
    pool
}

/// Per component: the Python guest instantiates 14 core modules, the
/// JavaScript one 4, a Rust one 3; each has one memory and two tables.
const CORE_INSTANCES_PER_COMPONENT: u32 = 32;
const MEMORIES_PER_COMPONENT: u32 = 2;
const TABLES_PER_COMPONENT: u32 = 8;

/// Bytes of a slot's linear memory (and table) reset by memset, not madvise.
const KEEP_RESIDENT: usize = 128 << 10;

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

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::component::Component;

    /// Regression (the thirty-second adversarial read, issue 23): proposals
    /// no guest needs were on, each more engine for a hostile component to
    /// reach. A component that uses one is refused, naming it.
    #[test]
    fn a_component_using_a_proposal_no_guest_needs_is_refused() {
        let engine = Engine::new(&compile_config()).unwrap();
        for (feature, module) in [
            ("memory64", "(memory i64 1)"),
            ("threads", "(memory 1 1 shared)"),
            ("exceptions", "(tag)"),
            ("gc", "(type (struct))"),
        ] {
            let bytes = wat::parse_str(format!("(component (core module {module}))")).unwrap();
            let error = format!("{:#}", Component::new(&engine, &bytes).err().unwrap());
            assert!(
                error.to_lowercase().contains(feature) || error.contains("not enabled"),
                "{feature}: {error}"
            );
        }
        let plain = wat::parse_str("(component (core module (memory 1)))").unwrap();
        Component::new(&engine, &plain).unwrap();
    }
}
