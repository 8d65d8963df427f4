//! Inbox retention: forgetting event ids once the broker can no longer replay them.
//!
//! Dedup only needs an id for as long as a copy of its event can still arrive,
//! which is the broker's replay window (14 days by default). Past that, rows go:
//! daily partitions are dropped whole (PostgreSQL with `partitioning = "daily"`),
//! everything else is deleted in small batches, each its own short transaction,
//! so a purge never holds a lock the pipeline would wait on for long.

use crate::config::{InboxConfig, InboxPartitioning};
use crate::db::{Database, DbError, business_keys, inbox, now_ms, outbox, partitions};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const MS_PER_DAY: i64 = 86_400_000;
/// Daily partitions are created this many days ahead, so a day never starts
/// without its partition even if the host was down for a while.
const DAYS_AHEAD: i32 = 2;

#[derive(Debug, Clone)]
pub struct PurgeOptions {
    pub older_than: Duration,
    pub batch_size: u32,
    pub dry_run: bool,
}

#[derive(Debug, Clone, Default)]
pub struct PurgeReport {
    /// Rows deleted (or, in a dry run, that would be).
    pub rows: u64,
    /// Daily partitions dropped (or that would be).
    pub partitions: Vec<String>,
    /// Business keys (`[handlers.dedup]`) deleted because their window had
    /// ended (a dry run counts none).
    pub business_keys: u64,
    pub elapsed: Duration,
}

impl PurgeReport {
    pub fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Creates the daily partitions from yesterday to a few days ahead.
pub async fn ensure_partitions(db: &Database, inbox: &InboxConfig) -> Result<Vec<String>, DbError> {
    if inbox.partitioning != InboxPartitioning::Daily {
        return Ok(Vec::new());
    }
    let today = (now_ms() / MS_PER_DAY) as i32;
    partitions::ensure_daily(db, today - 1..=today + DAYS_AHEAD).await
}

/// Purges inbox rows older than `options.older_than`; `progress` sees the
/// running report after every partition and batch.
pub async fn purge(
    db: &Database,
    options: &PurgeOptions,
    mut progress: impl FnMut(&PurgeReport),
) -> Result<PurgeReport, DbError> {
    let started = Instant::now();
    let cutoff_ms = now_ms() - options.older_than.as_millis() as i64;
    let mut report = PurgeReport::default();
    if db.backend() == crate::db::Backend::Postgres {
        // A partition goes only when every id day in it is past the cutoff.
        for (name, day) in partitions::list_daily(db).await? {
            if (i64::from(day) + 1) * MS_PER_DAY > cutoff_ms {
                continue;
            }
            let rows = partitions::row_count(db, &name).await?;
            if !options.dry_run {
                partitions::drop_partition(db, &name).await?;
            }
            report.rows += rows as u64;
            report.partitions.push(name);
            report.elapsed = started.elapsed();
            progress(&report);
        }
    }
    if options.dry_run {
        report.rows += inbox::count_older(db, cutoff_ms).await? as u64;
    } else {
        loop {
            let deleted = inbox::purge_batch(db, cutoff_ms, i64::from(options.batch_size)).await?;
            report.rows += deleted;
            report.elapsed = started.elapsed();
            progress(&report);
            if deleted < u64::from(options.batch_size) {
                break;
            }
        }
        // Keys whose dedup window ended hold nothing back any more.
        let now = now_ms();
        loop {
            let deleted = business_keys::purge_expired(db, now, i64::from(options.batch_size)).await?;
            report.business_keys += deleted;
            if deleted < u64::from(options.batch_size) {
                break;
            }
        }
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Deletes published outbox messages older than `retention`, in batches.
pub async fn purge_outbox(db: &Database, retention: Duration, batch_size: u32) -> Result<u64, DbError> {
    let cutoff_ms = now_ms() - retention.as_millis() as i64;
    let mut total = 0;
    loop {
        let deleted = outbox::purge_published(db, cutoff_ms, i64::from(batch_size)).await?;
        total += deleted;
        if deleted < u64::from(batch_size) {
            return Ok(total);
        }
    }
}

/// Runs partition upkeep and the purges every `purge_interval` until shutdown.
pub async fn run_scheduled(
    db: Database,
    inbox: InboxConfig,
    outbox_retention: Duration,
    shutdown: CancellationToken,
) {
    let options = PurgeOptions {
        older_than: inbox.retention,
        batch_size: inbox.purge_batch_size,
        dry_run: false,
    };
    loop {
        match ensure_partitions(&db, &inbox).await {
            Ok(created) if !created.is_empty() => tracing::info!(?created, "inbox partitions created"),
            Ok(_) => {}
            Err(error) => tracing::warn!("inbox partition upkeep failed (retried next cycle): {error}"),
        }
        let purged = tokio::select! {
            _ = shutdown.cancelled() => return,
            purged = purge(&db, &options, |_| {}) => purged,
        };
        match purged {
            Ok(report) if report.rows > 0 || report.business_keys > 0 => tracing::info!(
                rows = report.rows,
                business_keys = report.business_keys,
                partitions = ?report.partitions,
                ms = report.elapsed.as_millis() as u64,
                "purged inbox rows past retention"
            ),
            Ok(_) => {}
            Err(error) => tracing::warn!("inbox purge failed (retried next cycle): {error}"),
        }
        match purge_outbox(&db, outbox_retention, inbox.purge_batch_size).await {
            Ok(0) => {}
            Ok(rows) => tracing::info!(rows, "purged published outbox messages past retention"),
            Err(error) => tracing::warn!("outbox purge failed (retried next cycle): {error}"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(inbox.purge_interval) => {}
        }
    }
}
