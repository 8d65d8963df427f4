//! The host side of each WIT interface a handler imports, one file each.
//!
//! Each interface is implemented on a borrowed view of just the state it
//! needs, so `log` cannot reach the transaction and `sql` cannot reach the
//! log budget; `wasm::engine` links these views (and nothing else) into a
//! guest's world. Nothing here knows about wasmtime's store or instances.

pub mod log;
pub mod outbox;
pub mod sql;
