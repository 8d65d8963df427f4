//! Compiled components, cached on disk so a restart does not recompile.
//!
//! A Rust component compiles in ~80 ms, but Python and JavaScript ones take
//! 6-12 s (design §7). The cache key is the component's SHA-256 plus the
//! engine's compatibility hash (wasmtime version, target, settings), so a
//! different engine never loads a stale artifact. Entries are written to a
//! temporary file and renamed, so concurrent hosts never see half a file.
//!
//! Loading an entry runs native code from it: the cache folder must be
//! writable by inboxd alone.

use super::WasmEngine;
use super::compile_worker;
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use wasmtime::Engine;
use wasmtime::component::Component;

fn entry_path(dir: &Path, engine: &Engine, bytes: &[u8]) -> PathBuf {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let content: String = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{content}-{:016x}.cwasm", hasher.finish()))
}

/// Compiles `bytes`, or loads the compiled artifact from `dir` if it has one.
/// Returns the component and whether it came from the cache. Any problem with
/// the cache (unwritable, corrupt entry) falls back to compiling.
/// Compiling happens in a worker process with limits (`super::compile_worker`).
pub fn compile(wasm: &WasmEngine, bytes: &[u8]) -> wasmtime::Result<(Component, bool)> {
    let engine = &wasm.engine;
    let Some(dir) = wasm.cache_dir.as_deref() else {
        let compiled = compile_worker::precompile(engine, &wasm.compile_limits, bytes)?;
        // SAFETY: `compiled` was produced just now by this executable, with
        // this engine's compile settings.
        return Ok((unsafe { Component::deserialize(engine, &compiled) }?, false));
    };
    let path = entry_path(dir, engine, bytes);
    if path.is_file() {
        // SAFETY: the entry was written by `precompile_component` of an engine
        // with the same compatibility hash, into a folder only inboxd writes.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => return Ok((component, true)),
            Err(error) => {
                tracing::warn!(path = %path.display(), "ignoring a bad compile cache entry: {error:#}")
            }
        }
    }
    let compiled = compile_worker::precompile(engine, &wasm.compile_limits, bytes)?;
    // SAFETY: `compiled` was produced just now by this executable, with this
    // engine's compile settings.
    let component = unsafe { Component::deserialize(engine, &compiled) }?;
    // Stored only once loading it passed the instance pool's caps: a refused
    // component leaves nothing on disk.
    if let Err(error) = store(dir, &path, &compiled) {
        tracing::warn!(dir = %dir.display(), "cannot write the compile cache (compiling at every start): {error}");
    }
    Ok((component, false))
}

fn store(dir: &Path, path: &Path, compiled: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&temporary, compiled)?;
    std::fs::rename(&temporary, path)
}
