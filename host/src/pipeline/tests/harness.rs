//! One test's world: a database with the scripted handler's own tables
//! migrated the way production does it, a pipeline over them, records to
//! feed it, and the reads a test asserts on.

use super::scripted::{EFFECTS, Scripted};
use crate::config::{DedupConfig, EventIdConfig, RetryConfig};
use crate::db::dead_letters::{self, ReasonKind};
use crate::db::test_support::TestDb;
use crate::db::{Backend, SqlValue, Walls, migrate, offsets};
use crate::pipeline::{BatchCursor, BatchEnd, Loaded, Outcome, Pipeline, Slot};
use crate::record::Record;
use crate::stats::Stats;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const HANDLER: &str = "scripted";
pub const TOPIC: &str = "orders";
pub const PARTITION: i32 = 0;
/// Payloads past this are parked without running the handler.
pub const MAX_PAYLOAD: usize = 256;
/// A retried event runs at most this often; the backoff is 1 ms so retries cost nothing.
pub const MAX_ATTEMPTS: u32 = 3;

/// The handler's migration: `effects` for its writes. (No unique key: the
/// tests count rows to prove nothing ran twice, and SQLite's migration walls
/// refuse one, see `tests::a_handler_table_may_have_a_unique_key_on_sqlite`.)
const MIGRATION: &str = "CREATE TABLE effects (event_id TEXT NOT NULL, attempt BIGINT NOT NULL);";

/// The event id of the `n`th test event (a UUID, as the default config wants).
pub fn id(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// A record at `offset` carrying `event_id` in its `event_id` header.
pub fn record(offset: i64, event_id: &str) -> Record {
    Record {
        topic: TOPIC.to_owned(),
        partition: PARTITION,
        offset,
        key: None,
        payload: br#"{"order": 1}"#.to_vec(),
        headers: vec![("event_id".to_owned(), event_id.as_bytes().to_vec())],
        timestamp_ms: None,
        cut: None,
    }
}

/// Records of events `ids` at consecutive offsets from `first`.
pub fn records(first: i64, ids: &[u32]) -> Vec<Record> {
    (first..)
        .zip(ids)
        .map(|(offset, n)| record(offset, &id(*n)))
        .collect()
}

/// `(event id, attempt)` for each of `ids`, at attempt 1: a call order.
pub fn first_calls(ids: &[u32]) -> Vec<(String, u32)> {
    ids.iter().map(|n| (id(*n), 1)).collect()
}

/// The calls of a batch whose event `failed` fails on its first attempt:
/// the optimistic run (one savepoint for all calls) up to and including it,
/// then the run with a savepoint per call from the start, whose calls follow.
pub fn optimistic_then(ids: &[u32], failed: u32, then: &[(u32, u32)]) -> Vec<(String, u32)> {
    let upto = ids
        .iter()
        .position(|n| *n == failed)
        .expect("the failing event is in the batch");
    let mut calls = first_calls(&ids[..=upto]);
    calls.extend(then.iter().map(|(n, attempt)| (id(*n), *attempt)));
    calls
}

/// A dead letter as a test compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    pub event_id: Option<String>,
    pub offset: i64,
    pub kind: ReasonKind,
    pub attempts: i64,
    pub reason: String,
}

impl Parked {
    /// Event id, offset, kind and attempts: what most tests check at once.
    pub fn said(&self) -> (Option<&str>, i64, &str, i64) {
        (
            self.event_id.as_deref(),
            self.offset,
            self.kind.as_str(),
            self.attempts,
        )
    }
}

pub struct Harness {
    pub db: TestDb,
    pub handler: Arc<Scripted>,
    pub pipeline: Pipeline,
    pub shutdown: CancellationToken,
}

impl Harness {
    pub async fn new(db: TestDb) -> Self {
        Self::with_dedup(db, None).await
    }

    /// A harness whose handler dedups by a business key too.
    pub async fn with_dedup(db: TestDb, dedup: Option<DedupConfig>) -> Self {
        migrate::prepare_handler(&db, HANDLER).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0001_init.sql"), MIGRATION).unwrap();
        assert_eq!(migrate::apply_handler(&db, HANDLER, dir.path()).await.unwrap(), 1);
        let walls = Walls::load(&db, HANDLER, Duration::from_secs(5)).await.unwrap();
        let handler = Arc::new(Scripted::new(HANDLER, walls, MAX_PAYLOAD));
        let version = Loaded {
            handler: handler.clone(),
            event_id: EventIdConfig::default(),
            retry: RetryConfig {
                max_attempts: MAX_ATTEMPTS,
                backoff_initial_ms: 1,
                backoff_max_ms: 1,
            },
            dedup,
        };
        let pipeline = Pipeline::new((*db).clone(), Slot::new(version), Arc::new(Stats::default()));
        Self {
            db,
            handler,
            pipeline,
            shutdown: CancellationToken::new(),
        }
    }

    pub fn backend(&self) -> Backend {
        self.db.backend()
    }

    /// Failed guest calls as the pipeline counted them (metrics, console).
    pub fn guest_failures(&self) -> u64 {
        self.pipeline.stats.snapshot().guest_failures
    }

    /// Runs `records` as one batch from the stored offset; returns how it
    /// ended and the cursor.
    pub async fn batch(&self, records: &[Record]) -> (BatchEnd, BatchCursor) {
        let mut cursor = BatchCursor::new(self.offset().await);
        let end = self
            .pipeline
            .process_batch(records, &mut cursor, &self.shutdown)
            .await
            .unwrap();
        (end, cursor)
    }

    /// Runs one record on its own from the stored offset.
    pub async fn single(&self, record: &Record) -> Outcome {
        let expected = self.offset().await;
        self.pipeline
            .process(record, expected, &self.shutdown)
            .await
            .unwrap()
    }

    /// The handler's own rows: (event id, attempt), sorted.
    pub async fn effects(&self) -> Vec<(String, i64)> {
        let table = self.db.handler_table(HANDLER, EFFECTS);
        let sql = format!("SELECT event_id, attempt FROM {table} ORDER BY event_id, attempt");
        let rows = self.db.query(&sql, &[]).await.unwrap();
        rows.into_iter()
            .map(|r| (r[0].as_str().unwrap().to_owned(), r[1].as_i64().unwrap()))
            .collect()
    }

    /// The inbox status of `event_id` (`done`, `dead`), if it has a row.
    pub async fn status(&self, event_id: &str) -> Option<String> {
        let rows = self
            .db
            .query(
                "SELECT status FROM inbox WHERE handler = $1 AND event_id = $2",
                &[HANDLER.into(), event_id.into()],
            )
            .await
            .unwrap();
        rows.first().and_then(|r| r[0].as_str()).map(str::to_owned)
    }

    pub async fn inbox_rows(&self) -> i64 {
        self.db
            .query_i64("SELECT COUNT(*) FROM inbox WHERE handler = $1", &[HANDLER.into()])
            .await
            .unwrap()
    }

    /// The partition's stored next offset.
    pub async fn offset(&self) -> Option<i64> {
        offsets::load(&self.db, HANDLER, TOPIC, PARTITION).await.unwrap()
    }

    /// The one dead letter there must be.
    pub async fn only_dead_letter(&self, on: Backend) -> Parked {
        let mut parked = self.dead_letters().await;
        assert_eq!(parked.len(), 1, "{on:?}: {parked:?}");
        parked.remove(0)
    }

    pub async fn dead_letters(&self) -> Vec<Parked> {
        let listed = dead_letters::list(&self.db, HANDLER).await.unwrap();
        listed
            .into_iter()
            .map(|d| Parked {
                event_id: d.event_id,
                offset: d.offset,
                kind: d.kind,
                attempts: d.attempts,
                reason: d.reason,
            })
            .collect()
    }

    /// The outbox in insert order: (topic, key = the publishing event's id).
    pub async fn outbox(&self) -> Vec<(String, String)> {
        let rows = self
            .db
            .query(
                "SELECT topic, key FROM outbox WHERE handler = $1 ORDER BY seq",
                &[HANDLER.into()],
            )
            .await
            .unwrap();
        rows.into_iter()
            .map(|r| {
                let key = match &r[1] {
                    SqlValue::Blob(b) => String::from_utf8(b.clone()).unwrap(),
                    other => panic!("outbox key {other:?}"),
                };
                (r[0].as_str().unwrap().to_owned(), key)
            })
            .collect()
    }
}
