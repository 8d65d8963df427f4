//! The benchmark's driver: topics, databases, one child host per mode, the
//! two phases, and the report.

use crate::child::{Child, Role};
use crate::serve::ServeReport;
use crate::usage::Sample;
use crate::workload::{Producer, create_topic};
use anyhow::{Context, bail};
use inboxd::db::Database;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the driver reads the hosts' committed offsets.
const POLL: Duration = Duration::from_millis(100);

#[derive(clap::Args)]
pub struct Options {
    /// Records in the backlog each mode consumes (including the duplicates).
    #[arg(long, default_value_t = 200_000)]
    events: usize,
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Percent of records that re-send an earlier event.
    #[arg(long, default_value_t = 10)]
    duplicate_pct: u32,
    /// Records per second offered in the latency phase.
    #[arg(long, default_value_t = 5_000)]
    rate: u32,
    /// Seconds the latency phase offers records for.
    #[arg(long, default_value_t = 6)]
    live_secs: u64,
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres")]
    backends: Vec<String>,
    /// Any of plain (a batched consumer without Inboxd), po (plain with an
    /// outbox and its relay), a (default config),
    /// b (one event per transaction), c (native handler), d (instances reused
    /// between events), py and js (the Python and JavaScript billing guests,
    /// with instances reused), kp and kk (orders of Zipf-drawn customers, a
    /// native handler that waits --handler-ms per event, partition and key
    /// ordering).
    #[arg(long, value_delimiter = ',', default_value = "plain,po,a,b,c,d")]
    modes: Vec<String>,
    /// Records of the order modes' backlog (kp, kk).
    #[arg(long, default_value_t = 20_000)]
    keyed_events: usize,
    /// Customers the order modes' records are keyed by.
    #[arg(long, default_value_t = 10_000)]
    zipf_keys: usize,
    /// The Zipf exponent of the customers' orders: the hottest customer
    /// bounds key ordering (its records run one after another).
    #[arg(long, default_value_t = 0.8)]
    zipf_s: f64,
    /// Milliseconds each event of the order modes waits in its transaction.
    #[arg(long, default_value_t = 2)]
    handler_ms: u64,
    #[arg(long, env = "INBOXD_BENCH_BROKERS")]
    brokers: String,
    /// An admin URL of a PostgreSQL server; each mode gets a fresh database in it.
    #[arg(long, env = "INBOXD_BENCH_POSTGRES")]
    postgres: Option<String>,
    /// The billing component.
    #[arg(long, env = "INBOXD_BENCH_COMPONENT")]
    component: PathBuf,
    /// The billing handler's migrations.
    #[arg(long, env = "INBOXD_BENCH_MIGRATIONS")]
    migrations: PathBuf,
    /// librdkafka's `fetch.wait.max.ms` for the hosts. tansu answers a fetch
    /// only when this runs out, even when records arrive sooner (Kafka answers
    /// at once), so librdkafka's default of 500 ms would be measured as latency.
    #[arg(long, default_value_t = 10)]
    fetch_wait_ms: u32,
    /// Give up on a phase after this long.
    #[arg(long, default_value_t = 1_800)]
    timeout_secs: u64,
}

struct Mode {
    label: &'static str,
    what: &'static str,
    /// Extra `[[handlers]]` settings; empty: the defaults.
    settings: &'static str,
    native: bool,
    /// The plain consumer (`plain.rs`) in place of a host.
    plain: bool,
    /// The plain consumer writes an outbox and relays it (mode `po`).
    outbox: bool,
    /// Another billing component, next to `--component` (`None`: that one).
    component: Option<&'static str>,
    /// The order modes (`kp`, `kk`): the native handler waiting
    /// `--handler-ms` per event, over orders keyed by Zipf-drawn customers;
    /// the backlog only.
    slow: bool,
}

const MODES: [Mode; 10] = [
    Mode {
        label: "plain",
        what: "a plain batched consumer without Inboxd (claim, insert, offsets per poll)",
        settings: "",
        native: false,
        plain: true,
        outbox: false,
        component: None,
        slow: false,
    },
    Mode {
        label: "po",
        what: "the plain consumer plus an outbox message per event in its transaction, relayed to Kafka by a second connection",
        settings: "",
        native: false,
        plain: true,
        outbox: true,
        component: None,
        slow: false,
    },
    Mode {
        label: "a",
        what: "inboxd defaults (micro-batches), billing.wasm",
        settings: "",
        native: false,
        plain: false,
        outbox: false,
        component: None,
        slow: false,
    },
    Mode {
        label: "b",
        what: "one event per transaction, billing.wasm",
        settings: "[handlers.batch]\nmax_events = 1\nlinger_ms = 0\n",
        native: false,
        plain: false,
        outbox: false,
        component: None,
        slow: false,
    },
    Mode {
        label: "c",
        what: "inboxd defaults, native Rust billing (no Wasm)",
        settings: "",
        native: true,
        plain: false,
        outbox: false,
        component: None,
        slow: false,
    },
    Mode {
        label: "d",
        what: "inboxd defaults plus instances.reuse, billing.wasm",
        settings: "[handlers.instances]\nreuse = true\n",
        native: false,
        plain: false,
        outbox: false,
        component: None,
        slow: false,
    },
    Mode {
        label: "py",
        what: "inboxd defaults plus instances.reuse, billing_py.wasm (Python)",
        settings: "[handlers.instances]\nreuse = true\n",
        native: false,
        plain: false,
        outbox: false,
        component: Some("billing_py.wasm"),
        slow: false,
    },
    Mode {
        label: "js",
        what: "inboxd defaults plus instances.reuse, billing_js.wasm (JavaScript)",
        settings: "[handlers.instances]\nreuse = true\n",
        native: false,
        plain: false,
        outbox: false,
        component: Some("billing_js.wasm"),
        slow: false,
    },
    Mode {
        label: "kp",
        what: "native billing waiting --handler-ms per event, Zipf customer keys, ordering = \"partition\"",
        settings: "",
        native: true,
        plain: false,
        outbox: false,
        component: None,
        slow: true,
    },
    Mode {
        label: "kk",
        what: "native billing waiting --handler-ms per event, Zipf customer keys, ordering = \"key\"",
        settings: "ordering = \"key\"\n",
        native: true,
        plain: false,
        outbox: false,
        component: None,
        slow: true,
    },
];

/// The database connections of the order modes' hosts: enough for every
/// batch in flight (six partitions, up to `kafka::keyed::LANES` each), the
/// same for both so only the ordering differs.
const SLOW_CONNECTIONS: u32 = 56;

/// What one mode measured.
struct Measured {
    events_per_s: f64,
    /// The host's report; its latency is the last phase's (at `half_rate`).
    report: ServeReport,
    /// Latency at `--rate` records/s offered.
    live: Value,
    /// The rate of the last phase: half of (a)'s throughput, or of this mode's.
    half_rate: u32,
    /// CPU per event of each process over the backlog.
    cpu: Value,
    relay: Option<Relay>,
    effects: i64,
    expected_effects: usize,
}

/// The relay at the end of the backlog: what it still had to send and how
/// long it took to send it (a mode is done only when its relay has drained).
struct Relay {
    unpublished_at_last_commit: i64,
    drained_after_ms: u128,
}

impl Measured {
    fn json(&self) -> Value {
        json!({
            "events_per_s": self.events_per_s.round(),
            "p50_ms": self.live["latency_p50_ms"],
            "p99_ms": self.live["latency_p99_ms"],
            "half_rate": self.half_rate,
            "half_rate_p50_ms": self.report.latency_p50_ms,
            "half_rate_p99_ms": self.report.latency_p99_ms,
            "cpu_per_event": self.cpu,
            "relay_unpublished_at_last_commit": self.relay.as_ref().map(|r| r.unpublished_at_last_commit),
            "relay_drained_after_ms": self.relay.as_ref().map(|r| r.drained_after_ms),
            "peak_rss_mib": (self.report.peak_rss_kib as f64 / 1024.0).round(),
            "batches_in_flight_mean": (self.report.batches_in_flight_mean * 10.0).round() / 10.0,
            "batches_in_flight_peak": self.report.batches_in_flight_peak,
            "effects": self.effects,
            "effects_exact": self.effects == self.expected_effects as i64,
        })
    }
}

pub async fn run(opts: Options) -> anyhow::Result<()> {
    if let Some(unknown) = opts
        .modes
        .iter()
        .find(|l| !MODES.iter().any(|m| m.label == l.as_str()))
    {
        bail!("unknown mode {unknown:?}: use plain, po, a, b, c, d, py, js, kp or kk");
    }
    let work = tempfile::Builder::new().prefix("inboxd-bench-").tempdir()?;
    let producer = Producer::new(&opts.brokers)?;
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let bulk = format!("bench-orders-{run_id}");
    create_topic(&opts.brokers, &bulk, opts.partitions).await?;
    let started = Instant::now();
    let bulk_unique = producer.bulk(&bulk, opts.events, opts.duplicate_pct).await?;
    eprintln!(
        "produced {} records ({} distinct events) to {bulk} in {:.1} s",
        opts.events,
        bulk_unique,
        started.elapsed().as_secs_f64()
    );
    let ceiling = crate::ceiling::broker_only(&opts.brokers, &bulk, opts.events, opts.fetch_wait_ms).await?;
    eprintln!(
        "[broker only] {ceiling:.0} records/s: librdkafka reading the backlog, no database, no handler"
    );
    // The order modes' backlog: orders keyed by Zipf-drawn customers.
    let slow_wanted = MODES
        .iter()
        .any(|m| m.slow && opts.modes.iter().any(|l| l == m.label));
    let zipf = crate::workload::Zipf::new(opts.zipf_keys, opts.zipf_s);
    let keyed = format!("bench-customers-{run_id}");
    let mut keyed_unique = 0;
    if slow_wanted {
        create_topic(&opts.brokers, &keyed, opts.partitions).await?;
        keyed_unique = producer
            .bulk_zipf(&keyed, opts.keyed_events, opts.duplicate_pct, &zipf)
            .await?;
        eprintln!(
            "produced {} records ({keyed_unique} distinct events) to {keyed}: {} customers, Zipf s = {}, the \
             hottest with {:.1}% of the orders",
            opts.keyed_events,
            opts.zipf_keys,
            opts.zipf_s,
            zipf.hottest_share() * 100.0
        );
    }
    let mut results = serde_json::Map::new();
    for backend in &opts.backends {
        let mut measured = serde_json::Map::new();
        let mut rates = std::collections::BTreeMap::new();
        for mode in MODES.iter().filter(|m| opts.modes.iter().any(|l| l == m.label)) {
            eprintln!("[{backend} {}] {}", mode.label, mode.what);
            let (topic, unique) = match mode.slow {
                true => (&keyed, keyed_unique),
                false => (&bulk, bulk_unique),
            };
            let run = Run {
                opts: &opts,
                producer: &producer,
                work: work.path(),
                backend,
                mode,
                bulk: topic,
                bulk_unique: unique,
                half_of: rates.get("a").copied(),
            };
            let m = match run.measure().await {
                Ok(m) => m,
                Err(error) => {
                    // Keep the hosts' configs and logs for a look.
                    let kept = work.keep();
                    let context = format!("{backend}, mode {}; logs kept in {}", mode.label, kept.display());
                    return Err(error.context(context));
                }
            };
            eprintln!(
                "[{backend} {}] {:.0} events/s with {:.1} batches in flight (peak {}); CPU µs/event {}; relay {}; live at {}/s: p50 {} ms, p99 {} ms; at {}/s: p50 {} ms, p99 {} ms; peak RSS {:.0} MiB; effects {} of {}",
                mode.label,
                m.events_per_s,
                m.report.batches_in_flight_mean,
                m.report.batches_in_flight_peak,
                m.cpu,
                m.relay.as_ref().map_or("none".into(), |r| format!(
                    "{} unpublished at the last commit, drained after {} ms",
                    r.unpublished_at_last_commit, r.drained_after_ms
                )),
                opts.rate,
                m.live["latency_p50_ms"],
                m.live["latency_p99_ms"],
                m.half_rate,
                m.report.latency_p50_ms,
                m.report.latency_p99_ms,
                m.report.peak_rss_kib as f64 / 1024.0,
                m.effects,
                m.expected_effects
            );
            rates.insert(mode.label, m.events_per_s);
            measured.insert(mode.label.into(), m.json());
        }
        let ratios = [
            ("a_over_plain", "a", "plain"),
            ("c_over_plain", "c", "plain"),
            ("po_over_plain", "po", "plain"),
            ("a_over_po", "a", "po"),
            ("c_over_po", "c", "po"),
            ("a_over_b", "a", "b"),
            ("a_over_c", "a", "c"),
            ("py_over_d", "py", "d"),
            ("js_over_d", "js", "d"),
            ("kk_over_kp", "kk", "kp"),
        ];
        for (name, this, over) in ratios {
            if let (Some(this), Some(other)) = (rates.get(this), rates.get(over)) {
                measured.insert(name.into(), json!((this / other * 100.0).round() / 100.0));
            }
        }
        results.insert(backend.clone(), Value::Object(measured));
    }
    let mut summary = json!({
        "records": opts.events,
        "partitions": opts.partitions,
        "duplicate_pct": opts.duplicate_pct,
        "live_rate": opts.rate,
        "broker_only_records_per_s": ceiling.round(),
    });
    if slow_wanted {
        summary["order_modes"] = json!({
            "records": opts.keyed_events,
            "customers": opts.zipf_keys,
            "zipf_s": opts.zipf_s,
            "hottest_customer_share": (zipf.hottest_share() * 1000.0).round() / 1000.0,
            "handler_ms": opts.handler_ms,
        });
    }
    summary.as_object_mut().expect("an object").extend(results);
    println!("{summary}");
    Ok(())
}

/// One mode on one backend.
struct Run<'a> {
    opts: &'a Options,
    producer: &'a Producer,
    work: &'a Path,
    backend: &'a str,
    mode: &'a Mode,
    bulk: &'a str,
    bulk_unique: usize,
    /// (a)'s events/s on this backend, once measured: the last phase offers half.
    half_of: Option<f64>,
}

impl Run<'_> {
    async fn measure(&self) -> anyhow::Result<Measured> {
        let opts = self.opts;
        let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let live = format!("bench-live-{id}");
        let invoices = format!("bench-invoices-{id}");
        create_topic(&opts.brokers, &live, opts.partitions).await?;
        create_topic(&opts.brokers, &invoices, opts.partitions).await?;
        let db_url = self.database_url(id).await?;
        let log = self
            .work
            .join(format!("{}-{}.log", self.backend, self.mode.label));
        let topics = [self.bulk.to_owned(), live.clone()];
        let group = format!("bench-{id}");
        let config = self
            .work
            .join(format!("{}-{}.toml", self.backend, self.mode.label));
        let role = if self.mode.plain {
            Role::Plain {
                database: &db_url,
                brokers: &opts.brokers,
                topics: &topics,
                group: &group,
                fetch_wait_ms: opts.fetch_wait_ms,
                outbox_topic: self.mode.outbox.then_some(invoices.as_str()),
            }
        } else {
            std::fs::write(&config, self.config(&db_url, &live, &invoices, &group))?;
            Role::Host {
                config: &config,
                native: self.mode.native,
                handler_ms: if self.mode.slow { opts.handler_ms } else { 0 },
            }
        };
        // The benchmark's own connections first: opening a SQLite file puts it
        // in WAL mode, which needs its lock, and the host starting beside it
        // held that lock often enough to fail the run ("database is locked").
        let db = Database::connect(&db_url, 2).await?;
        let mut child = Child::spawn(role, &log)?;
        let deadline = Duration::from_secs(opts.timeout_secs);
        let progress = self.progress_sql();

        // Phase 1: the backlog, timed from the first commit to the last.
        let bulk_total = match self.mode.slow {
            true => opts.keyed_events,
            false => opts.events,
        } as i64;
        let spawned = Instant::now();
        let at_spawn = Sample::take(child.pid());
        let (first, at_first) = wait_for(&db, &progress, &mut child, deadline, |p| p > 0).await?;
        let at_first_commit = Sample::take(child.pid());
        let (last, _) = wait_for(&db, &progress, &mut child, deadline, |p| p >= bulk_total).await?;
        // A backlog too small to see in flight (smoke runs) is timed from the
        // host's start instead, group join included: slower, never zero.
        let (from, before, counted) = if at_first < bulk_total {
            (first, at_first_commit, bulk_total - at_first)
        } else {
            (spawned, at_spawn, bulk_total)
        };
        let events_per_s = counted as f64 / (last - from).as_secs_f64().max(1e-3);
        let relay = match self.unsent_sql() {
            Some(unsent) => Some(relay_drains(&db, &unsent, &mut child, last, deadline).await?),
            None => None,
        };
        // After the relay has drained, so its whole cost is counted.
        let cpu = Sample::take(child.pid()).per_event(before, counted);
        child.end_phase().await?;

        if self.mode.slow {
            // The order modes compare throughput only.
            let report = child.stop().await?;
            let effects = db.query_i64(&self.count_invoices(), &[]).await?;
            db.close().await;
            return Ok(Measured {
                events_per_s,
                report,
                live: json!({}),
                half_rate: 0,
                cpu,
                relay,
                effects,
                expected_effects: self.bulk_unique,
            });
        }

        // Phase 2: live traffic at a fixed rate, for latency.
        let mut total = bulk_total;
        let mut unique = self.bulk_unique;
        let (records, distinct) = self.live(&live, opts.rate).await?;
        (total, unique) = (total + records as i64, unique + distinct);
        wait_for(&db, &progress, &mut child, deadline, |p| p >= total).await?;
        let at_rate = child.end_phase().await?;

        // Phase 3: live traffic at half of (a)'s throughput.
        let half_rate = (self.half_of.unwrap_or(events_per_s) / 2.0).max(1.0) as u32;
        let (records, distinct) = self.live(&live, half_rate).await?;
        (total, unique) = (total + records as i64, unique + distinct);
        wait_for(&db, &progress, &mut child, deadline, |p| p >= total).await?;
        let report = child.stop().await?;
        let effects = db.query_i64(&self.count_invoices(), &[]).await?;
        db.close().await;
        Ok(Measured {
            events_per_s,
            report,
            live: at_rate,
            half_rate,
            cpu,
            relay,
            effects,
            expected_effects: unique,
        })
    }

    async fn live(&self, topic: &str, rate: u32) -> anyhow::Result<(usize, usize)> {
        let duration = Duration::from_secs(self.opts.live_secs);
        self.producer
            .paced(topic, rate, duration, self.opts.duplicate_pct)
            .await
    }

    async fn database_url(&self, id: &str) -> anyhow::Result<String> {
        match self.backend {
            "sqlite" => Ok(format!(
                "sqlite://{}",
                self.work
                    .join(format!("{}-{id}.sqlite", self.mode.label))
                    .display()
            )),
            "postgres" => {
                let admin = self
                    .opts
                    .postgres
                    .as_deref()
                    .context("the postgres backend needs --postgres or INBOXD_BENCH_POSTGRES")?;
                create_database(admin, &format!("inboxd_bench_{id}")).await
            }
            other => bail!("unknown backend {other:?}: use sqlite or postgres"),
        }
    }

    fn config(&self, db_url: &str, live: &str, invoices: &str, group: &str) -> String {
        format!(
            r#"[database]
url = "{db_url}"
{connections}

[kafka]
brokers = "{brokers}"
session_timeout_ms = 6000
[kafka.properties]
"fetch.wait.max.ms" = "{fetch_wait}"

[wasm]
cache_dir = "{cache}"

[[handlers]]
name = "billing"
component = "{component}"
migrations = "{migrations}"
topics = ["{bulk}", "{live}"]
group_id = "{group}"
{settings}
[handlers.outbox_topics]
"invoices.created" = "{invoices}"
"#,
            brokers = self.opts.brokers,
            fetch_wait = self.opts.fetch_wait_ms,
            cache = self.work.join("cache").display(),
            component = match self.mode.component {
                Some(file) => self.opts.component.with_file_name(file),
                None => self.opts.component.clone(),
            }
            .display(),
            migrations = self.opts.migrations.display(),
            bulk = self.bulk,
            settings = self.mode.settings,
            connections = match self.mode.slow {
                true => format!("max_connections = {SLOW_CONNECTIONS}"),
                false => String::new(),
            },
        )
    }

    fn count_invoices(&self) -> String {
        match (self.backend, self.mode.plain) {
            ("postgres", false) => "SELECT COUNT(*) FROM handler_billing.invoices".into(),
            ("postgres", true) => "SELECT COUNT(*) FROM public.invoices".into(),
            _ => "SELECT COUNT(*) FROM invoices".into(),
        }
    }

    /// The count of outbox messages not yet sent, if the mode has an outbox.
    fn unsent_sql(&self) -> Option<String> {
        match (self.backend, self.mode.plain, self.mode.outbox) {
            (_, false, _) => {
                Some("SELECT COUNT(*) FROM outbox WHERE published_at IS NULL AND parked_at IS NULL".into())
            }
            (_, true, false) => None,
            ("postgres", true, true) => Some(crate::plain::unsent_sql("public.")),
            (_, true, true) => Some(crate::plain::unsent_sql("")),
        }
    }

    /// Records committed so far, summed over the partitions.
    fn progress_sql(&self) -> String {
        match (self.backend, self.mode.plain) {
            ("postgres", true) => crate::plain::progress_sql("public."),
            (_, true) => crate::plain::progress_sql(""),
            _ => {
                "SELECT CAST(COALESCE(SUM(next_offset), 0) AS BIGINT) FROM offsets WHERE handler = 'billing'"
                    .into()
            }
        }
    }
}

async fn create_database(admin_url: &str, name: &str) -> anyhow::Result<String> {
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(admin_url)
        .await
        .context("connecting to PostgreSQL")?;
    sqlx::Executor::execute(&mut admin, format!("CREATE DATABASE {name}").as_str()).await?;
    let base = admin_url
        .rsplit_once('/')
        .context("the PostgreSQL URL needs a database path")?
        .0;
    Ok(format!("{base}/{name}"))
}

/// Waits until the relay has sent every outbox message the backlog wrote;
/// `last` is when the backlog's last record committed.
async fn relay_drains(
    db: &Database,
    unsent: &str,
    child: &mut Child,
    last: Instant,
    deadline: Duration,
) -> anyhow::Result<Relay> {
    let unpublished_at_last_commit = db.query_i64(unsent, &[]).await?;
    loop {
        if db.query_i64(unsent, &[]).await? == 0 {
            return Ok(Relay {
                unpublished_at_last_commit,
                drained_after_ms: last.elapsed().as_millis(),
            });
        }
        child.check_running()?;
        if last.elapsed() > deadline {
            bail!(
                "the relay did not drain within {deadline:?}; the host's log is {}",
                child.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls the committed offsets (summed over the handler's partitions) until
/// `done` holds; returns when and at what count it first held.
async fn wait_for(
    db: &Database,
    progress_sql: &str,
    child: &mut Child,
    deadline: Duration,
    done: impl Fn(i64) -> bool,
) -> anyhow::Result<(Instant, i64)> {
    let started = Instant::now();
    loop {
        // The table appears once the host has migrated; until then, nothing is done.
        let progress = db.query_i64(progress_sql, &[]).await.unwrap_or(0);
        if done(progress) {
            return Ok((Instant::now(), progress));
        }
        child.check_running()?;
        if started.elapsed() > deadline {
            bail!(
                "no progress past {progress} records within {deadline:?}; the child's log is {}",
                child.log.display()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
