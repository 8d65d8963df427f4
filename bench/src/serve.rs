//! The host side of one benchmark run, in a child process of its own so its
//! peak RSS is the host's alone.
//!
//! It runs `inboxd` from a config file exactly as `inboxd run` does (or with
//! the native billing handler in place of the component). On SIGUSR1 (between
//! phases) it prints one JSON line with the latency percentiles of the phase
//! that ended and starts a new record; on SIGTERM it stops cleanly and prints
//! one JSON line: the handler's counters, the last phase's latency
//! percentiles and the process's peak RSS.

use crate::native::NativeBilling;
use anyhow::Context;
use inboxd::config::Config;
use inboxd::handler::Handler;
use inboxd::host::Host;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[derive(Default, serde::Serialize, serde::Deserialize)]
pub struct ServeReport {
    pub applied: u64,
    pub duplicates: u64,
    pub dead_lettered: u64,
    pub latency_p50_ms: u64,
    pub latency_p99_ms: u64,
    pub latency_max_ms: u64,
    pub peak_rss_kib: u64,
    /// Batches in flight during the backlog (the throughput phase): their
    /// time-weighted mean and peak. Below the partition count on a backlog,
    /// some partitions waited.
    pub batches_in_flight_mean: f64,
    pub batches_in_flight_peak: u64,
}

pub async fn serve(config_path: &Path, native: bool, handler_ms: u64) -> anyhow::Result<()> {
    let config = Config::load(config_path).context("loading the benchmark's config")?;
    let mut natives: BTreeMap<String, Arc<dyn Handler>> = BTreeMap::new();
    if native {
        let handler = &config.handlers[0];
        let native = NativeBilling {
            invoices_topic: handler
                .outbox_topics
                .get("invoices.created")
                .cloned()
                .unwrap_or_else(|| "invoices.created".into()),
            max_payload_bytes: handler.limits.max_payload_bytes,
            walls: inboxd::db::Walls::new(
                &handler.name,
                inboxd::sandbox::authorizer::Scope::Guest,
                &["invoices".to_owned()],
                std::time::Duration::from_millis(handler.limits.timeout_ms),
            ),
            delay: std::time::Duration::from_millis(handler_ms),
        };
        natives.insert(handler.name.clone(), Arc::new(native));
    }
    let host = Host::start_with(&config, natives).await?;
    let stats = host.stats().values().next().cloned().context("no handler")?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(host.run(shutdown.clone()));
    let mut reset = signal(SignalKind::user_defined1())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut backlog = None;
    loop {
        tokio::select! {
            _ = reset.recv() => {
                let phase = stats.snapshot();
                println!(
                    "{}",
                    serde_json::json!({
                        "latency_p50_ms": phase.latency_p50_ms,
                        "latency_p99_ms": phase.latency_p99_ms,
                        "latency_max_ms": phase.latency_max_ms,
                    })
                );
                backlog.get_or_insert(phase);
                stats.reset_latency();
            }
            _ = term.recv() => break,
        }
    }
    shutdown.cancel();
    running.await?;
    let snapshot = stats.snapshot();
    let report = ServeReport {
        applied: snapshot.applied,
        duplicates: snapshot.duplicates,
        dead_lettered: snapshot.dead_lettered,
        latency_p50_ms: snapshot.latency_p50_ms,
        latency_p99_ms: snapshot.latency_p99_ms,
        latency_max_ms: snapshot.latency_max_ms,
        peak_rss_kib: peak_rss_kib(),
        batches_in_flight_mean: backlog.map_or(0.0, |b| b.batches_in_flight_mean),
        batches_in_flight_peak: backlog.map_or(0, |b| b.batches_in_flight_peak),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// `VmHWM` from /proc/self/status: the resident set's high-water mark.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
