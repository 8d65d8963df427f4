//! Logging on stderr, filtered by `INBOXD_LOG` (or `RUST_LOG`): readable
//! lines by default, one JSON object per line with `--log-format json` (or
//! `INBOXD_LOG_FORMAT=json`) for log shippers. stdout is left to command
//! output (the demo's summary, `--json` documents).

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
