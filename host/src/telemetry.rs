//! Logging on stderr, filtered by `INBOXD_LOG` (or `RUST_LOG`): readable
//! lines by default, one JSON object per line with `--log-format json` (or
//! `INBOXD_LOG_FORMAT=json`) for log shippers. stdout is left to command
//! output (the demo's summary, `--json` documents).
//!
//! Also where the process decides about library backtraces, see
//! [`library_backtraces_off_unless_asked`].

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

pub fn init(default_filter: &str, format: LogFormat) {
    let filter = EnvFilter::try_from_env("INBOXD_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Sets `RUST_LIB_BACKTRACE=0` unless it is set already, so `RUST_BACKTRACE=1`
/// (common in containers) keeps backtraces for panics but not for every error
/// value a library creates. wasmtime creates one each time a `Store` is
/// dropped (it disposes the store's idle fiber with a "future dropped"
/// error), and with backtraces on, capturing it was 10% of the host's CPU on
/// a backlog (measured with `perf`). Set `RUST_LIB_BACKTRACE=1` to get them.
///
/// # Safety
/// Call it first thing in `main`, before any other thread exists (it sets an
/// environment variable; see [`std::env::set_var`]).
pub unsafe fn library_backtraces_off_unless_asked() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: the caller guarantees no other thread is running.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}
