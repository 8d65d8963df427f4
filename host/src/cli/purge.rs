//! `inboxd purge`: delete inbox rows past retention now, with progress.

use super::CliError;
use crate::config::{Config, parse_duration};
use crate::retention::{self, PurgeOptions};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct PurgeArgs {
    #[arg(long, short, env = "INBOXD_CONFIG", default_value = "inboxd.toml")]
    pub config: PathBuf,
    /// Delete rows processed longer ago than this ("14d", "36h"); default: inbox.retention.
    #[arg(long, value_parser = parse_duration)]
    pub older_than: Option<Duration>,
    /// Rows per delete transaction; default: inbox.purge_batch_size.
    #[arg(long)]
    pub batch_size: Option<u32>,
    /// Count what would go, delete nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Progress goes to stdout at most once a second, and once at the end.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

pub async fn purge(args: PurgeArgs) -> Result<(), CliError> {
    let config = Config::load(&args.config).map_err(|e| CliError::Usage(e.to_string()))?;
    let batch_size = args.batch_size.unwrap_or(config.inbox.purge_batch_size);
    if batch_size == 0 {
        return Err(CliError::Usage("--batch-size must be at least 1".into()));
    }
    let options = PurgeOptions {
        older_than: args.older_than.unwrap_or(config.inbox.retention),
        batch_size,
        dry_run: args.dry_run,
    };
    let db = crate::db::open(&config)
        .await
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let mut last = Instant::now();
    let report = retention::purge(&db, &options, |report| {
        if last.elapsed() >= PROGRESS_EVERY {
            println!(
                "purging: {} rows so far, {:.0} rows/s",
                report.rows,
                report.rows_per_second()
            );
            last = Instant::now();
        }
    })
    .await
    .map_err(|e| CliError::Failed(format!("purge failed: {e}")))?;
    db.close().await;
    let verb = if options.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    println!(
        "{verb} {} inbox rows older than {} ({} whole partitions) in {:.2} s: {:.0} rows/s",
        report.rows,
        humantime::format_duration(options.older_than),
        report.partitions.len(),
        report.elapsed.as_secs_f64(),
        report.rows_per_second()
    );
    if report.business_keys > 0 {
        println!(
            "deleted {} business keys whose dedup window had ended",
            report.business_keys
        );
    }
    Ok(())
}
