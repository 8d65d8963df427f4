//! Every default value of the configuration, in one place.

pub const DATABASE_URL: &str = "sqlite://inboxd.sqlite";
/// One connection per handler's partition pump plus headroom for the admin work.
pub const MAX_CONNECTIONS: u32 = 8;
pub const EVENT_ID_HEADER: &str = "event_id";
pub const EVENT_ID_JSON_FIELD: &str = "event_id";
/// Long enough for a real handler's SQL, short enough that a runaway guest
/// holds its partition (and its transaction) for seconds, not minutes.
pub const TIMEOUT_MS: u64 = 5_000;
/// Per instance. Rust guests need a few MiB; Python and JS guests need tens.
pub const MEMORY_MB: u64 = 128;
/// Guest stdout and stderr kept per event and copied into the host log.
pub const OUTPUT_BYTES: usize = 16 * 1024;
/// SQL statements one event may run: far above any real handler, low
/// enough to stop a guest that loops over the database.
pub const MAX_STATEMENTS: u32 = 1_000;
/// Rows one query may return.
pub const MAX_ROWS: usize = 10_000;
pub const MAX_STATEMENT_BYTES: usize = 64 * 1024;
/// Bytes one query may return: a result is held in host memory while the
/// guest copies it in, so it is bounded before it is kept.
pub const MAX_RESULT_BYTES: usize = 16 * 1024 * 1024;
/// Larger events are dead-lettered without running the handler.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// The largest row a handler's table may hold, and the largest value its SQL
/// may bind or build, in bytes of text (a `bytea` counts twice, as hex). This
/// is what bounds the work PostgreSQL does on one row without looking at the
/// deadline (`sandbox::work`: the larger it is, the fewer operations a
/// statement may have), and it is SQLite's `SQLITE_LIMIT_LENGTH` inside the
/// walls. A handler that stores whole payloads of `max_payload_bytes` raises it.
pub const MAX_ROW_BYTES: usize = 1024 * 1024;
pub const MAX_OUTBOX_MESSAGES: usize = 100;
pub const MAX_OUTBOX_BYTES: usize = 1024 * 1024;
/// Published outbox rows are kept this long for inspection, then purged;
/// zero deletes each as the relay settles it (see `db::outbox::settle_sent`).
pub const OUTBOX_RETENTION: &str = "0s";
/// Records of one partition per transaction. A commit costs an fsync, so
/// sharing it is the lever (design §7: ~290 vs ~20,000 events/s on
/// PostgreSQL at 1 vs 100 per transaction); more than this adds latency
/// and lock time for little gain.
pub const MAX_BATCH: usize = 100;
/// With `ordering = "key"`, a partition's keys in flight at once: enough to
/// keep its lanes full under a skewed key distribution.
pub const MAX_KEYS_IN_FLIGHT: usize = 1_000;
/// With `ordering = "key"`, records a handler may hold behind dead letters:
/// each is a dead letter with its payload, so this bounds the table's growth
/// while a key stays blocked.
pub const MAX_HELD_RECORDS: u64 = 100_000;
/// How long a partition's first waiting record may wait for company. While
/// a batch is in flight, the next one fills anyway, so under load batches
/// grow without waiting and at low load this bounds the added latency.
pub const LINGER_MS: u64 = 5;
/// A reused instance is replaced once its linear memory passes this
/// (a reused JavaScript instance grows without end, design §7).
pub const RECYCLE_MEMORY_MB: u64 = 64;
/// ... or once it has handled this many events.
pub const RECYCLE_AFTER_EVENTS: u32 = 1_000;
pub const MAX_ATTEMPTS: u32 = 5;
pub const BACKOFF_INITIAL_MS: u64 = 100;
pub const BACKOFF_MAX_MS: u64 = 30_000;
pub const SESSION_TIMEOUT_MS: u32 = 10_000;
/// Kafka's usual replay window: an inbox row must outlive every copy of
/// its event that the broker can still deliver.
pub const RETENTION: &str = "14d";
pub const PURGE_INTERVAL: &str = "1h";
/// Rows deleted per purge transaction: small enough that no lock is held
/// for more than milliseconds, large enough that 1M rows take seconds.
pub const PURGE_BATCH_SIZE: u32 = 5_000;
/// The admin API listens on loopback only unless told otherwise: it speaks plain HTTP.
pub const ADMIN_LISTEN: &str = "127.0.0.1:8480";
/// Python and JavaScript components are tens of MiB; Rust ones hundreds of KiB.
pub const MAX_COMPONENT_MB: u64 = 100;

// Global maxima: no handler, config file or upload, may exceed these.

/// Ten minutes: beyond this an event is a job, not a message.
pub const GLOBAL_MAX_TIMEOUT_MS: u64 = 600_000;
pub const GLOBAL_MAX_MEMORY_MB: u64 = 4_096;
pub const GLOBAL_MAX_BATCH: u64 = 10_000;
pub const GLOBAL_MAX_LINGER_MS: u64 = 10_000;

// Built-in ceilings of a team token (`[[admin.tokens]]` with `handlers`)
// whose `[admin.tokens.ceilings]` does not set the key. They are set for a
// shared host: several teams, one SQLite writer or a small PostgreSQL pool,
// and handlers that run per partition in parallel. Each is several times the
// default (a real handler that needs more than the default fits) and far
// below the global maximum (a careless or hostile upload cannot take the
// host with it). An operator raises one for one token by setting it.

/// 6x the default: room for slow SQL; a runaway event holds its partition
/// (and, on SQLite, the single writer) for half a minute per attempt, not ten.
pub const TEAM_CEILING_TIMEOUT_MS: u64 = 30_000;
/// Per instance, and there is one instance per partition being processed:
/// Python and JavaScript guests need tens of MiB, 512 leaves them 4x the
/// default while 8 partitions of one handler stay within 4 GiB.
pub const TEAM_CEILING_MEMORY_MB: u64 = 512;
/// Copied into the host log per event: 16x the default.
pub const TEAM_CEILING_OUTPUT_BYTES: u64 = 256 * 1024;
/// 10x the default.
pub const TEAM_CEILING_MAX_STATEMENTS: u64 = 10_000;
/// Rows of one query are held in host memory: 10x the default.
pub const TEAM_CEILING_MAX_ROWS: u64 = 100_000;
/// A query's result is held in host memory: 4x the default.
pub const TEAM_CEILING_MAX_RESULT_BYTES: u64 = 64 * 1024 * 1024;
/// 16x the default; the statement guard parses every statement.
pub const TEAM_CEILING_MAX_STATEMENT_BYTES: u64 = 1024 * 1024;
/// 4x the default (Kafka's own default message limit is 1 MB); a batch's
/// records are held in memory together.
pub const TEAM_CEILING_MAX_PAYLOAD_BYTES: u64 = 4 * 1024 * 1024;
/// 8x the default (room for a payload at the team ceiling, as hex): the
/// statement guard counts every value at this size, so past it a statement
/// may hold only a few operations.
pub const TEAM_CEILING_MAX_ROW_BYTES: u64 = 8 * 1024 * 1024;
/// At this size one call of the costliest allowed function takes seconds,
/// so the statement guard's row bound admits no more than one.
pub const GLOBAL_MAX_ROW_BYTES: u64 = 64 * 1024 * 1024;
/// 10x the default: outbox rows are written in the event's transaction.
pub const TEAM_CEILING_MAX_OUTBOX_MESSAGES: u64 = 1_000;
pub const TEAM_CEILING_MAX_OUTBOX_BYTES: u64 = 8 * 1024 * 1024;
/// 10x the default. Gains from sharing a commit flatten well below this
/// (design §7), while a batch holds its transaction (on SQLite: the writer
/// every handler shares) for the whole batch.
pub const TEAM_CEILING_MAX_BATCH: u64 = 1_000;
/// Latency added at low load; a second is already more than a handler needs
/// to fill a batch under load.
pub const TEAM_CEILING_LINGER_MS: u64 = 1_000;
/// A failing event blocks its partition (order is kept) for up to
/// max_attempts x (timeout + backoff): 20 keeps that within minutes.
pub const TEAM_CEILING_MAX_ATTEMPTS: u64 = 20;
/// 10x the default: the partition waits this long between attempts.
pub const TEAM_CEILING_BACKOFF_MAX_MS: u64 = 300_000;
/// A reused instance may hold this much before it is replaced: as much as
/// the memory ceiling (above it the memory limit stops the guest first).
pub const TEAM_CEILING_RECYCLE_MEMORY_MB: u64 = 512;
/// 100x the default: a reused instance carries state (and leaks) across this many events.
pub const TEAM_CEILING_RECYCLE_AFTER_EVENTS: u64 = 100_000;

/// The largest `limits.max_row_bytes` a handler may have on SQLite. The
/// sorter's runs ([`CACHE_KIB`]) hold 16 rows of this size; at 8 MiB rows
/// they held one each, and 64 of them sorted held 1 GiB of the heap and
/// 1.6 s without a deadline check in one step (the forty-third adversarial
/// read, issue 23), and at the heap's ceiling sqlx failed to copy a result's
/// value and the host crashed. A larger cache is no cure: a run of small
/// rows is sorted in one step too (above). Larger rows need PostgreSQL.
pub const SQLITE_MAX_ROW_BYTES: usize = 1 << 20;

/// Why a `limits.max_row_bytes` above [`SQLITE_MAX_ROW_BYTES`] is refused on
/// SQLite (by the configuration's check and by every load, uploads too).
pub fn sqlite_row_bytes_refused(bytes: usize) -> String {
    format!(
        "limits.max_row_bytes is {bytes}; on SQLite at most {SQLITE_MAX_ROW_BYTES} (SQLite sorts inside the \
         host's memory, in steps no deadline interrupts, and larger rows made those steps unbounded): lower \
         it, or use PostgreSQL"
    )
}
