//! The sandbox walls between a guest and deduplication (design §5).
//!
//! Wall 1 is [`guard`], the statement guard. Wall 2 is the database's own
//! privileges: per-handler roles on PostgreSQL (set up in `db::migrate`) and
//! the [`authorizer`] on SQLite. The pipeline checks its own rows before every
//! commit as the last line.

pub mod authorizer;
pub mod guard;

pub use guard::{Guard, Refusal};

/// The host's tables: no handler may read or write them, whatever the wall.
pub const HOST_TABLES: &[&str] = &[
    "inbox",
    "offsets",
    "dead_letters",
    "handler_migrations",
    "handler_tables",
    "outbox",
    // Dropped in migration 0002; still refused, as any host name is.
    "outbox_sequences",
    "outbox_leases",
    "_sqlx_migrations",
];
