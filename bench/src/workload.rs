//! The benchmark's input: order-confirmed events, one in ten a re-sent copy
//! of an earlier one (same key, same event id), as a retrying producer or an
//! operator's replay would send them.

use anyhow::Context;
use rand::Rng;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use std::time::{Duration, Instant};

/// One event as produced; a duplicate is the same value sent again.
#[derive(Clone)]
struct Order {
    event_id: String,
    key: String,
    payload: Vec<u8>,
}

impl Order {
    /// An order; its Kafka key is `key` (a customer, say), else its own id.
    fn keyed(n: usize, key: Option<String>) -> Self {
        let event_id = uuid::Uuid::now_v7().to_string();
        let order_id = format!("order-{n}-{}", &event_id[24..]);
        let key = key.unwrap_or_else(|| order_id.clone());
        let payload = serde_json::json!({
            "event_id": event_id,
            "order_id": order_id,
            "customer_email": format!("customer{n}@example.com"),
            "amount_cents": 1000 + (n % 5000) as i64,
        })
        .to_string()
        .into_bytes();
        Self {
            event_id,
            key,
            payload,
        }
    }
}

/// Builds `records` records, `duplicate_pct` percent of them re-sends of an
/// earlier record; returns them and how many distinct events they hold.
fn orders(records: usize, duplicate_pct: u32) -> (Vec<Order>, usize) {
    orders_keyed(records, duplicate_pct, || None)
}

/// As [`orders`], each new order keyed by what `key` says.
fn orders_keyed(
    records: usize,
    duplicate_pct: u32,
    mut key: impl FnMut() -> Option<String>,
) -> (Vec<Order>, usize) {
    let mut rng = rand::rng();
    let mut out: Vec<Order> = Vec::with_capacity(records);
    let mut unique = 0;
    for n in 0..records {
        if !out.is_empty() && rng.random_range(0..100) < duplicate_pct {
            let earlier = out[rng.random_range(0..out.len())].clone();
            out.push(earlier);
        } else {
            out.push(Order::keyed(n, key()));
            unique += 1;
        }
    }
    (out, unique)
}

/// Keys 0..n drawn with probability proportional to 1 / (rank ^ s): a few
/// customers place many of the orders, most place few.
pub struct Zipf {
    /// Cumulative weights, rank 1 first.
    cumulative: Vec<f64>,
}

impl Zipf {
    pub fn new(keys: usize, s: f64) -> Self {
        let mut total = 0.0;
        let cumulative = (1..=keys.max(1))
            .map(|rank| {
                total += (rank as f64).powf(-s);
                total
            })
            .collect();
        Self { cumulative }
    }

    /// The share of draws the hottest key takes.
    pub fn hottest_share(&self) -> f64 {
        self.cumulative[0] / self.cumulative[self.cumulative.len() - 1]
    }

    fn draw(&self, rng: &mut impl Rng) -> usize {
        let total = self.cumulative[self.cumulative.len() - 1];
        let point = rng.random_range(0.0..total);
        self.cumulative.partition_point(|c| *c <= point)
    }
}

pub struct Producer {
    producer: FutureProducer,
}

impl Producer {
    pub fn new(brokers: &str) -> anyhow::Result<Self> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "1000000")
            .set("queue.buffering.max.kbytes", "1048576")
            .create()
            .context("creating the producer")?;
        Ok(Self { producer })
    }

    fn send(&self, topic: &str, order: &Order) -> anyhow::Result<DeliveryFuture> {
        let headers = OwnedHeaders::new().insert(Header {
            key: "event_id",
            value: Some(order.event_id.as_bytes()),
        });
        let record = FutureRecord::to(topic)
            .key(&order.key)
            .payload(&order.payload)
            .headers(headers);
        self.producer
            .send_result(record)
            .map_err(|(e, _)| anyhow::anyhow!("enqueueing a record: {e}"))
    }

    /// Produces as fast as the broker takes them; returns the distinct events sent.
    pub async fn bulk(&self, topic: &str, records: usize, duplicate_pct: u32) -> anyhow::Result<usize> {
        let (orders, unique) = orders(records, duplicate_pct);
        let mut pending = Vec::with_capacity(orders.len());
        for order in &orders {
            pending.push(self.send(topic, order)?);
        }
        for delivery in pending {
            delivered(delivery).await?;
        }
        Ok(unique)
    }

    /// As [`Producer::bulk`], the orders keyed by customers drawn from `zipf`.
    pub async fn bulk_zipf(
        &self,
        topic: &str,
        records: usize,
        duplicate_pct: u32,
        zipf: &Zipf,
    ) -> anyhow::Result<usize> {
        let mut rng = rand::rng();
        let (orders, unique) = orders_keyed(records, duplicate_pct, || {
            Some(format!("customer-{}", zipf.draw(&mut rng)))
        });
        let mut pending = Vec::with_capacity(orders.len());
        for order in &orders {
            pending.push(self.send(topic, order)?);
        }
        for delivery in pending {
            delivered(delivery).await?;
        }
        Ok(unique)
    }

    /// Produces at `rate` records per second for `duration`, in 10 ms ticks,
    /// as live traffic would arrive; returns (records, distinct events).
    pub async fn paced(
        &self,
        topic: &str,
        rate: u32,
        duration: Duration,
        duplicate_pct: u32,
    ) -> anyhow::Result<(usize, usize)> {
        let records = (rate as u64 * duration.as_millis() as u64 / 1000) as usize;
        let (orders, unique) = orders(records, duplicate_pct);
        let started = Instant::now();
        let mut ticks = tokio::time::interval(Duration::from_millis(10));
        let mut pending = Vec::with_capacity(orders.len());
        let mut sent = 0;
        while sent < orders.len() {
            ticks.tick().await;
            // Catch up to where the schedule says we should be.
            let due = ((started.elapsed().as_millis() as u64 * rate as u64) / 1000) as usize;
            while sent < due.min(orders.len()) {
                pending.push(self.send(topic, &orders[sent])?);
                sent += 1;
            }
        }
        for delivery in pending {
            delivered(delivery).await?;
        }
        Ok((records, unique))
    }
}

async fn delivered(delivery: DeliveryFuture) -> anyhow::Result<()> {
    match delivery.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((error, _))) => Err(anyhow::anyhow!("a record was not delivered: {error}")),
        Err(_) => Err(anyhow::anyhow!("the producer dropped a record")),
    }
}

pub async fn create_topic(brokers: &str, name: &str, partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("creating the admin client")?;
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics([&topic], &options).await? {
        result.map_err(|(topic, code)| anyhow::anyhow!("creating topic {topic} failed: {code}"))?;
    }
    Ok(())
}
