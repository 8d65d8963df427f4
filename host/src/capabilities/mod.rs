//! The host side of each WIT interface a handler imports, one file each.
//!
//! This is the only code that touches the `Linker`. Each interface is
//! implemented on a borrowed view of just the state it needs, so `log` cannot
//! reach the transaction and `sql` cannot reach the log budget.

pub mod log;
pub mod outbox;
pub mod sql;

use crate::wasm::bindings::{log_api, outbox_api, sql_api, types_api};
use crate::wasm::state::StoreState;
use wasmtime::component::Linker;

/// Adds WASI (with the empty context built per store) and Inboxd's interfaces.
pub fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    types_api::add_to_linker::<_, log::LogCap>(linker, |s| log::LogView { state: &mut s.log })?;
    log_api::add_to_linker::<_, log::LogCap>(linker, |s| log::LogView { state: &mut s.log })?;
    sql_api::add_to_linker::<_, sql::SqlCap>(linker, |s| sql::SqlView { state: &mut s.sql })?;
    outbox_api::add_to_linker::<_, outbox::OutboxCap>(linker, |s| outbox::OutboxView {
        state: &mut s.outbox,
    })?;
    Ok(())
}
