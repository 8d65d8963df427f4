//! The WebAssembly side: engine, bindings, per-invocation store, limits, and
//! loading and invoking a handler component.
//!
//! A guest runs only through [`HandlerComponent::invoke`], which hands it the
//! event's open transaction and takes it back. It must never give a guest
//! anything else: no connection, no files, no network, no clock-free loop.

mod cache;
mod compile_bounds;
pub mod compile_worker;
mod component;
mod engine;
mod image_bounds;
pub mod limits;
mod output;
pub(crate) mod state;
mod warm;

pub use component::{HandlerComponent, Interfaces, LoadError, Reuse};
pub use engine::WasmEngine;
pub use limits::EPOCH_TICK;
