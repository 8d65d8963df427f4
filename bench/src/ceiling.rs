//! The broker-only ceiling: how fast librdkafka reads the same backlog from
//! the same broker with no database and no handler at all. No mode can
//! consume faster than this on the machine it ran on, so it puts the modes'
//! rates in proportion (issue 15: "show what bounds it and what the ceiling is").

use anyhow::{Context, bail};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::time::{Duration, Instant};

/// Records/s reading all `records` of `topic` once, timed from the first
/// record to the last, with a fresh consumer group and the hosts' fetch wait.
pub async fn broker_only(
    brokers: &str,
    topic: &str,
    records: usize,
    fetch_wait_ms: u32,
) -> anyhow::Result<f64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("inboxd-bench-ceiling-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", fetch_wait_ms.to_string())
        .create()
        .context("creating the ceiling's consumer")?;
    consumer
        .subscribe(&[topic])
        .context("subscribing the ceiling's consumer")?;
    // Polling blocks, so it runs on a thread of its own, like a host's pump.
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut first = None;
        let mut read = 0;
        while read < records {
            if Instant::now() > deadline {
                bail!("the broker-only read got {read} of {records} records in 10 minutes");
            }
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(_)) => {
                    first.get_or_insert_with(Instant::now);
                    read += 1;
                }
                Some(Err(error)) => bail!("the broker-only read failed: {error}"),
                None => {}
            }
        }
        let took = first.map_or(Duration::ZERO, |f| f.elapsed()).as_secs_f64();
        Ok(read as f64 / took.max(1e-6))
    })
    .await?
}
