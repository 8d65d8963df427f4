//! The sandbox walls between a guest and deduplication (design §5).
//!
//! Wall 1 is the statement guard ([`guard`] for run-time statements,
//! [`migration`] for a handler's migrations, statement by statement). Wall 2
//! is the database's own privileges: per-handler roles on PostgreSQL (set up
//! in `db::migrate`) and the allowlist [`authorizer`] on SQLite. Both walls
//! are allowlists of what a handler may touch (its own tables); nothing here
//! lists the host's tables, so a host table added later is covered by
//! construction (a test enumerates a migrated database to prove it). The
//! pipeline checks its own rows before every commit as the last line.

pub mod authorizer;
pub mod guard;
pub mod migration;
pub mod nesting;
pub mod postgres;
pub mod sqlite_memory;
mod sqlite_registers;
mod sqlite_sorts;
pub mod sqlite_upsert;
pub mod sqlite_work;
pub(crate) mod walk;
pub mod work;

pub use guard::{Guard, Refusal};

/// Name prefixes the host keeps for its own tables, today's and any later
/// migration's (`inbox`, `offsets`, `outbox`, `dead_letters`, `handlers`,
/// `handler_*`, sqlx's `_sqlx_migrations`), the databases' catalogs and
/// SQLite's table-valued functions. A
/// handler cannot create a table or index under them, so on SQLite, where
/// every table shares one namespace, no handler can take a name the host
/// will need, and a refusal can say "this is the host's".
pub const RESERVED_PREFIXES: &[&str] = &[
    "inbox",
    "offsets",
    "outbox",
    "dead_letter",
    "handler",
    "_sqlx",
    "sqlite_",
    "pg_",
    // SQLite's own table-valued functions, found after any table of the
    // same name: a team's table `pragma_table_xinfo` made the host's own
    // reads of every other handler's columns fail, and their loads with
    // them (the thirty-first adversarial read, issue 23).
    "pragma_",
    "dbstat",
];

/// Names of SQLite's own table-valued functions that a table of the same
/// name would hide from the host's statements (see [`RESERVED_PREFIXES`]).
pub fn shadows_sqlite(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.starts_with("pragma_") || name.starts_with("dbstat")
}

/// True for names the host keeps (see [`RESERVED_PREFIXES`]).
pub fn is_reserved(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Scalar, aggregate and window functions a handler may call: no side
/// effects, nothing outside the statement's own rows, no way to build a
/// value much larger than the statement's own text (which is why `printf`,
/// `format`, `lpad`, `rpad` and `repeat`, whose widths are numbers, are not
/// here), and no single call whose time grows with the product of two
/// lengths, since neither database interrupts one call at a deadline
/// (`instr`, `position`, `strpos` and `replace` are not here; `trim` and its
/// kin take one argument only; `LIKE`, `ILIKE` and `GLOB` are refused by the
/// guard). Not here either: the aggregates that build one value from many
/// rows (`string_agg`, `group_concat`, `array_agg`, `json_agg`,
/// `jsonb_agg`), which make values of up to a gigabyte from a short
/// statement, that other calls then work on without interruption. The
/// statement guard and SQLite's authorizer use this one list.
pub const PURE_FUNCTIONS: &[&str] = &[
    "abs",
    "avg",
    "bool_and",
    "bool_or",
    "ceil",
    "ceiling",
    "char_length",
    "coalesce",
    "concat",
    "concat_ws",
    "count",
    "current_date",
    "current_time",
    "current_timestamp",
    "date",
    "date_part",
    "date_trunc",
    "datetime",
    "dense_rank",
    "every",
    "floor",
    "gen_random_uuid",
    "greatest",
    "hex",
    "ifnull",
    "iif",
    "json_array",
    "json_build_array",
    "json_build_object",
    "json_extract",
    "json_object",
    "jsonb_build_array",
    "jsonb_build_object",
    "julianday",
    "lag",
    "lead",
    "least",
    "left",
    "length",
    "lower",
    "ltrim",
    "max",
    "md5",
    "min",
    "mod",
    "now",
    "nullif",
    "power",
    "random",
    "rank",
    "right",
    "round",
    "row_number",
    "rtrim",
    "sign",
    "sqrt",
    "strftime",
    "substr",
    "substring",
    "sum",
    "to_char",
    "to_timestamp",
    "total",
    "trim",
    "trunc",
    "typeof",
    "unixepoch",
    "upper",
];

/// The longest format a formatting call may take (`to_timestamp` on
/// PostgreSQL, `strftime` on SQLite): each of its fields is a pass over the
/// input, in one call no deadline interrupts.
pub const MAX_FORMAT_BYTES: usize = 64;

/// Set-returning functions a handler may use in FROM.
pub const TABLE_FUNCTIONS: &[&str] = &[
    "generate_series",
    "json_each",
    "json_tree",
    "jsonb_array_elements",
    "jsonb_each",
    "unnest",
];
