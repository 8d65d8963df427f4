//! The one `bindgen!` for the `inboxd:handler` world, re-exported with curated names.
//!
//! `sql` is async because its statements await the database; `log` and
//! `outbox` never block. `handle` is called asynchronously so a guest runs on
//! a fiber that epoch interruption can stop.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "handler",
    imports: {
        "inboxd:handler/sql": async,
    },
    exports: {
        default: async,
    },
});

pub use self::inboxd::handler::log::{self as log_api, Level};
pub use self::inboxd::handler::outbox::{self as outbox_api, Message};
pub use self::inboxd::handler::sql::{self as sql_api, SqlDialect, SqlError};
pub use self::inboxd::handler::types::{self as types_api, Value};
