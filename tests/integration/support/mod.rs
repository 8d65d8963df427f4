//! Shared test plumbing: broker address, topics, producing, guest paths,
//! database checks and polling with a deadline; a child `inboxd` process
//! ([`host`]), orders to send ([`traffic`]) and a private PostgreSQL
//! ([`pg_cluster`]) have files of their own.

mod host;
mod pg_cluster;
mod traffic;

pub use host::*;
pub use pg_cluster::*;
pub use traffic::*;

use inboxd::db::{Database, SqlValue, offsets};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub fn brokers() -> String {
    std::env::var("INBOXD_TEST_BROKERS").expect(
        "INBOXD_TEST_BROKERS is not set: run the suite with scripts/test, which starts a tansu broker",
    )
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

pub fn guest_wasm(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../guests/target/wasm32-wasip2/release")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/test (it builds the guests)",
        path.display()
    );
    path
}

pub fn guest_migrations(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../guests")
        .join(name)
        .join("migrations")
}

pub async fn create_topic(name: &str, partitions: i32) {
    create_topic_on(&brokers(), name, partitions).await
}

/// As [`create_topic`], on the broker at `brokers` (a test's own).
pub async fn create_topic_on(brokers: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let results = admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create_topics request");
    for result in results {
        result.unwrap_or_else(|(topic, code)| panic!("creating topic {topic} failed: {code}"));
    }
}

/// A record to produce: key (empty: none), optional `event_id` and `traceparent` headers, payload.
pub struct Send {
    pub key: String,
    pub event_id_header: Option<String>,
    pub payload: Vec<u8>,
    pub traceparent: Option<String>,
}

impl Send {
    /// An order event with its id in both the header and the payload, as producers usually send.
    pub fn order(event_id: &str, order_id: &str) -> Self {
        let payload = serde_json::json!({
            "event_id": event_id,
            "order_id": order_id,
            "customer_email": "buyer@example.com",
            "amount_cents": 1250,
        });
        Self {
            key: order_id.to_owned(),
            event_id_header: Some(event_id.to_owned()),
            payload: payload.to_string().into_bytes(),
            traceparent: None,
        }
    }

    pub fn json(event_id: &str, body: serde_json::Value) -> Self {
        let mut body = body;
        body["event_id"] = event_id.into();
        Self {
            key: event_id.to_owned(),
            event_id_header: None,
            payload: body.to_string().into_bytes(),
            traceparent: None,
        }
    }
}

/// Produces one gzip-compressed record: a batch that is small on the wire
/// and as large as the producer likes once decompressed (the producer checks
/// only the uncompressed size, against a `message.max.bytes` raised here).
pub async fn produce_gzip(topic: &str, key: &[u8], headers: OwnedHeaders, payload: &[u8]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("compression.type", "gzip")
        .set("message.max.bytes", "1000000000")
        .create()
        .expect("producer");
    producer
        .send(
            FutureRecord::to(topic).key(key).payload(payload).headers(headers),
            Duration::from_secs(60),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("delivered");
}

/// Produces every record (pipelined), returns the next offset per partition.
pub async fn produce(topic: &str, records: &[Send]) -> HashMap<i32, i64> {
    produce_to(&brokers(), topic, records).await
}

/// As [`produce`], to the broker at `brokers` (a test's own).
pub async fn produce_to(brokers: &str, topic: &str, records: &[Send]) -> HashMap<i32, i64> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let mut pending = Vec::new();
    for record in records {
        let mut headers = OwnedHeaders::new();
        if let Some(id) = &record.event_id_header {
            headers = headers.insert(Header {
                key: "event_id",
                value: Some(id.as_bytes()),
            });
        }
        if let Some(trace) = &record.traceparent {
            headers = headers.insert(Header {
                key: "traceparent",
                value: Some(trace.as_bytes()),
            });
        }
        let mut sent = FutureRecord::to(topic).payload(&record.payload).headers(headers);
        // An empty key is none: a record without a key.
        if !record.key.is_empty() {
            sent = sent.key(&record.key);
        }
        let future = producer
            .send_result(sent)
            .map_err(|(e, _)| e)
            .expect("enqueue record");
        pending.push(future);
    }
    let mut ends = HashMap::new();
    for future in pending {
        let delivery = future
            .await
            .expect("delivery future")
            .map_err(|(e, _)| e)
            .expect("delivered");
        let end = ends.entry(delivery.partition).or_insert(0);
        *end = (*end).max(delivery.offset + 1);
    }
    ends
}

/// Which database a test runs against; the compliance suite runs each scenario on both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The shared PostgreSQL server that `scripts/test` starts (its `postgres` database).
pub fn postgres_admin_url() -> String {
    std::env::var("INBOXD_TEST_POSTGRES")
        .expect("INBOXD_TEST_POSTGRES is not set: run the suite with scripts/test, which starts PostgreSQL")
}

/// Creates a fresh database on the server at `admin_url`; returns its URL.
pub async fn create_postgres_database(admin_url: &str) -> String {
    use sqlx::Connection;
    let name = format!("inboxd_test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(admin_url)
        .await
        .expect("connect to the test PostgreSQL");
    sqlx::Executor::execute(&mut admin, format!("CREATE DATABASE {name}").as_str())
        .await
        .expect("CREATE DATABASE");
    let base = admin_url
        .rsplit_once('/')
        .expect("admin URL has a database path")
        .0;
    format!("{base}/{name}")
}

pub async fn database_url(backend: Backend, dir: &Path) -> String {
    match backend {
        Backend::Sqlite => format!("sqlite://{}", dir.join("inboxd.sqlite").display()),
        Backend::Postgres => create_postgres_database(&postgres_admin_url()).await,
    }
}

/// The outbox topics a guest publishes to, mapped (to the same name) as a
/// handler's config must map them for the host to let it publish.
pub fn default_outbox_topics(guest: &str) -> &'static [(&'static str, &'static str)] {
    match guest {
        "billing" | "billing_py" | "billing_js" => &[("invoices.created", "invoices.created")],
        _ => &[],
    }
}

/// A `[[handlers]]` entry for one of the guests, with its own consumer group
/// and the outbox mapping it needs ([`default_outbox_topics`]).
pub fn handler_block(guest: &str, topic: &str) -> String {
    handler_block_with_outbox(guest, topic, default_outbox_topics(guest))
}

/// As [`handler_block`], with `outbox_topics` (logical name -> real topic)
/// written inline, so tables appended after it still belong to the entry.
pub fn handler_block_with_outbox(guest: &str, topic: &str, outbox: &[(&str, &str)]) -> String {
    let mut block = format!(
        "[[handlers]]\nname = \"{guest}\"\ncomponent = \"{}\"\ntopics = [\"{topic}\"]\nmigrations = \"{}\"\ngroup_id = \"{}\"\n",
        guest_wasm(guest).display(),
        guest_migrations(guest).display(),
        unique("group"),
    );
    if !outbox.is_empty() {
        let pairs: Vec<String> = outbox
            .iter()
            .map(|(name, real)| format!("{name:?} = {real:?}"))
            .collect();
        block.push_str(&format!("outbox_topics = {{ {} }}\n", pairs.join(", ")));
    }
    block
}

/// The chain billing -> outbox -> notifier: billing on `orders_topic`,
/// its `invoices.created` mapped to `invoices_topic`, which notifier consumes.
pub fn chain_handlers(orders_topic: &str, invoices_topic: &str) -> String {
    format!(
        "{}\n{}",
        handler_block_with_outbox("billing", orders_topic, &[("invoices.created", invoices_topic)]),
        handler_block("notifier", invoices_topic)
    )
}

/// A test's own folder, database and config file for one handler.
pub struct TestEnv {
    pub dir: tempfile::TempDir,
    pub db_url: String,
    pub config_path: PathBuf,
    pub handler: String,
    pub topic: String,
}

impl TestEnv {
    /// `handler_toml` is appended to the `[[handlers]]` table after name/component/topics.
    pub async fn new(backend: Backend, guest: &str, topic: &str, handler_toml: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let db_url = database_url(backend, dir.path()).await;
        Self::with_database(dir, db_url, guest, topic, handler_toml)
    }

    /// A fresh folder and database on `backend`, with `rest` (handlers, other
    /// sections) in its config; `handler` and `topic` are what its checks read.
    pub async fn with_handlers(backend: Backend, handler: &str, topic: &str, rest: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let db_url = database_url(backend, dir.path()).await;
        let cache = dir.path().join("compile-cache");
        Self::with_config(dir, db_url, &cache, handler, topic, rest)
    }

    pub fn with_database(
        dir: tempfile::TempDir,
        db_url: String,
        guest: &str,
        topic: &str,
        handler_toml: &str,
    ) -> Self {
        let cache = dir.path().join("compile-cache");
        let handlers = format!("{}\n{handler_toml}", handler_block(guest, topic));
        Self::with_config(dir, db_url, &cache, guest, topic, &handlers)
    }

    /// Writes `inboxd.toml` in `dir`: the database, the test broker and the
    /// compile cache, then `rest` (handlers, an admin section).
    pub fn with_config(
        dir: tempfile::TempDir,
        db_url: String,
        cache: &Path,
        handler: &str,
        topic: &str,
        rest: &str,
    ) -> Self {
        let config_path = dir.path().join("inboxd.toml");
        let config = format!(
            r#"
[database]
url = "{db_url}"

[kafka]
brokers = "{brokers}"
session_timeout_ms = 6000

[wasm]
cache_dir = "{cache}"

{rest}
"#,
            brokers = brokers(),
            cache = cache.display(),
        );
        std::fs::write(&config_path, config).expect("write config");
        Self {
            dir,
            db_url,
            config_path,
            handler: handler.to_owned(),
            topic: topic.to_owned(),
        }
    }

    pub fn spawn_host(&self) -> HostProcess {
        self.spawn_host_with(&[])
    }

    /// A host with extra environment variables (failpoints, for one).
    pub fn spawn_host_with(&self, vars: &[(&str, &str)]) -> HostProcess {
        spawn_inboxd(self.dir.path(), &self.config_path, vars)
    }

    pub async fn db(&self) -> Database {
        Database::connect(&self.db_url, 2)
            .await
            .expect("test database connection")
    }

    /// A handler table's name as host SQL must write it (schema-qualified on PostgreSQL).
    pub async fn table(&self, table: &str) -> String {
        self.db().await.handler_table(&self.handler, table)
    }

    /// Waits until the stored offsets reach `ends` on every partition; fails
    /// at once if the host exits, and with the host's log at the deadline.
    pub async fn wait_for_offsets(
        &self,
        ends: &HashMap<i32, i64>,
        deadline: Duration,
        host: &mut HostProcess,
    ) {
        let db = self.db().await;
        let started = Instant::now();
        loop {
            let stored = progress(&db, &self.handler, &self.topic).await;
            if ends
                .iter()
                .all(|(p, end)| stored.get(p).is_some_and(|n| n >= end))
            {
                return;
            }
            let exited = host.child.try_wait().expect("try_wait");
            if exited.is_some() || started.elapsed() > deadline {
                panic!(
                    "offsets did not reach {ends:?} (stored {stored:?}); host exited: {exited:?}\n--- host log ---\n{}",
                    host.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Exactly once, checked on the database: one effect row per unique event
    /// id in `table`, no id twice, offsets at the ends, and every offset
    /// committed by exactly one transaction.
    pub async fn assert_exactly_once(&self, table: &str, unique_events: usize, ends: &HashMap<i32, i64>) {
        let db = self.db().await;
        let table = db.handler_table(&self.handler, table);
        assert_eq!(
            count(&db, &format!("SELECT COUNT(*) FROM {table}")).await,
            unique_events as i64,
            "one effect per unique event"
        );
        let doubled = format!(
            "SELECT COUNT(*) FROM (SELECT event_id FROM {table} GROUP BY event_id HAVING COUNT(*) > 1) d"
        );
        assert_eq!(count(&db, &doubled).await, 0, "no event applied twice");
        let positions = inboxd::db::offsets::load_all(&db, &self.handler)
            .await
            .expect("offsets");
        let stored: HashMap<i32, i64> = positions.iter().map(|p| (p.partition, p.next_offset)).collect();
        assert_eq!(&stored, ends, "stored offsets are exactly the ends");
        for p in &positions {
            assert_eq!(
                p.records_committed, p.next_offset,
                "partition {} had an offset committed twice: {p:?}",
                p.partition
            );
        }
    }
}

pub async fn stored_offsets(db: &Database, handler: &str, topic: &str) -> HashMap<i32, i64> {
    polled_offsets(db, handler, topic).await.expect("load offsets")
}

/// The offsets Kafka holds as committed for `group` (what lag tools read),
/// per partition that has one.
pub async fn kafka_committed(group: &str, topic: &str, partitions: i32) -> HashMap<i32, i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("a consumer to read committed offsets");
        let mut list = rdkafka::TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(&topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .expect("the group's committed offsets");
        committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                rdkafka::Offset::Offset(offset) => Some((e.partition(), offset)),
                _ => None,
            })
            .collect()
    })
    .await
    .expect("reading committed offsets")
}

/// The `group_id` of the config's first handler.
pub fn group_of(config_path: &Path) -> String {
    let config = inboxd::config::Config::load(config_path).expect("the test's config");
    config.handlers[0].group_id()
}

/// As [`stored_offsets`], but an error (the host has not created its tables
/// yet) reads as "no progress", for use inside polls.
pub async fn progress(db: &Database, handler: &str, topic: &str) -> HashMap<i32, i64> {
    polled_offsets(db, handler, topic).await.unwrap_or_default()
}

pub async fn polled_offsets(
    db: &Database,
    handler: &str,
    topic: &str,
) -> Result<HashMap<i32, i64>, inboxd::db::DbError> {
    Ok(offsets::load_all(db, handler)
        .await?
        .into_iter()
        .filter(|position| position.topic == topic)
        .map(|position| (position.partition, position.next_offset))
        .collect())
}

pub async fn count(db: &Database, sql: &str) -> i64 {
    db.query_i64(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

pub async fn rows(db: &Database, sql: &str) -> Vec<Vec<SqlValue>> {
    db.query(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Polls `check` every 25 ms until it returns true or `deadline` passes.
pub async fn poll_until<F, Fut>(deadline: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if check().await {
            return true;
        }
        if started.elapsed() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Runs a scenario `async fn name(backend: Backend)` once per backend, as
/// tests `name::sqlite` and `name::postgres`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::support::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::support::Backend::Postgres).await
            }
        }
    )*};
}
