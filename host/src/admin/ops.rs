//! `/metrics`, `/healthz` and `/readyz`: open, for scrapers and probes.

use super::AppState;
use super::counts::Counts;
use crate::config::KafkaConfig;
use crate::db::Database;
use crate::metrics::HandlerLabel;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A probe must answer faster than the orchestrator's timeout (often 1-5 s).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What `/readyz` asks the database and the broker (through a client that
/// only asks for metadata), and their last answers.
pub struct ReadyProbe(Arc<Probes>);

struct Probes {
    client: Option<Arc<BaseConsumer>>,
    /// When they last answered, and how: `/readyz` is open, and each request
    /// took a database connection and asked for every topic's metadata on a
    /// blocking thread (the seventeenth read). Answers serve [`PROBE_FRESH`];
    /// one probe runs at a time, and the requests meanwhile take its answers.
    last: tokio::sync::Mutex<Option<(Instant, Answers)>>,
}

/// The database's answer and the broker's.
type Answers = (Result<(), String>, Result<(), String>);

/// How long a probe's answers serve `/readyz`.
const PROBE_FRESH: Duration = Duration::from_secs(1);

impl ReadyProbe {
    pub fn new(kafka: &KafkaConfig) -> Self {
        let mut config = ClientConfig::new();
        for (key, value) in &kafka.properties {
            config.set(key, value);
        }
        config.set("bootstrap.servers", &kafka.brokers);
        let client = match config.create::<BaseConsumer>() {
            Ok(client) => Some(Arc::new(client)),
            Err(error) => {
                tracing::warn!("cannot create the broker probe for /readyz: {error}");
                None
            }
        };
        Self(Arc::new(Probes {
            client,
            last: tokio::sync::Mutex::new(None),
        }))
    }

    /// The answers, fresh or from a probe run now. The probe runs on a task
    /// of its own that holds the turn: a request that goes away does not
    /// end it, so the next request waits for its answers instead of
    /// starting another (a probe's blocking thread runs up to 2 s anyway:
    /// the eighteenth read).
    async fn answers(&self, db: &Database) -> Answers {
        let (probes, db) = (self.0.clone(), db.clone());
        let probe = tokio::spawn(async move {
            let mut last = probes.last.lock().await;
            if let Some((at, answers)) = &*last
                && at.elapsed() < PROBE_FRESH
            {
                return answers.clone();
            }
            let database = tokio::time::timeout(PROBE_TIMEOUT, db.query("SELECT 1", &[]))
                .await
                .map_err(|_| "timed out".to_owned())
                .and_then(|r| r.map(drop).map_err(|e| e.to_string()));
            let answers = (database, probes.broker().await);
            *last = Some((Instant::now(), answers.clone()));
            answers
        });
        probe.await.unwrap_or_else(|error| {
            let failed = Err(format!("the probe failed: {error}"));
            (failed.clone(), failed)
        })
    }
}

impl Probes {
    async fn broker(&self) -> Result<(), String> {
        let Some(client) = self.client.clone() else {
            return Err("no broker client".into());
        };
        tokio::task::spawn_blocking(move || client.fetch_metadata(None, PROBE_TIMEOUT))
            .await
            .map_err(|e| e.to_string())?
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// The process is up and serving.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready when the database and the broker answer and every handler loaded.
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let (database, broker) = state.probe.answers(state.registry.db()).await;
    let handlers = if state.registry.is_ready() {
        Ok(())
    } else {
        Err("a handler version failed to load (see the log)".to_owned())
    };
    let ready = database.is_ok() && broker.is_ok() && handlers.is_ok();
    let show = |r: Result<(), String>| r.err().unwrap_or_else(|| "ok".into());
    let body = json!({
        "ready": ready,
        "database": show(database),
        "broker": show(broker),
        "handlers": show(handlers),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}

/// Prometheus text format. The outbox backlog and parked dead letters are
/// read from the database now (skipped, keeping the last values, if it is down).
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let registry = &state.registry;
    let metrics = registry.metrics();
    let names: Vec<String> = registry.running().await.into_keys().collect();
    // A scrape still answers while the database is away; these gauges keep their last value.
    if let Ok(counts) = state.counts.get(registry.db()).await {
        set_gauges(metrics, &names, &counts);
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        metrics.encode(),
    )
}

/// Sets each handler's count gauges from `counts`.
fn set_gauges(metrics: &crate::metrics::Metrics, names: &[String], counts: &Counts) {
    for (counts, family) in [
        (&counts.outbox_backlog, &metrics.outbox_backlog),
        (&counts.outbox_parked, &metrics.outbox_parked),
        (&counts.dead_letters_parked, &metrics.dead_letters_parked),
        (&counts.held_records, &metrics.held_records),
    ] {
        for name in names {
            family
                .get_or_create(&HandlerLabel {
                    handler: name.clone(),
                })
                .set(counts.get(name).copied().unwrap_or(0));
        }
    }
}
