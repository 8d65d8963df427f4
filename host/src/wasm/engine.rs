//! The wasmtime `Engine`, its epoch ticker, and the shared `Linker`.
//!
//! One engine per host process: compiled components and the linker are tied
//! to it, and one ticker thread drives every store's time limit.

use super::limits::EPOCH_TICK;
use super::state::StoreState;
use std::path::PathBuf;
use std::sync::Arc;
use wasmtime::component::Linker;
use wasmtime::{Config, Engine};

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
        let engine = Engine::new(&config)?;
        spawn_epoch_ticker(&engine);
        let mut linker = Linker::new(&engine);
        crate::capabilities::add_to_linker(&mut linker)?;
        Ok(Self {
            engine,
            linker: Arc::new(linker),
            cache_dir,
        })
    }
}

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
