//! The chaos test: the headline reliability figure.
//!
//! Three hosts in one consumer group on PostgreSQL and a real broker, each
//! running the chain billing -> outbox -> relay -> notifier. Orders with 20%
//! re-sent copies and 1% designed to fail for good; meanwhile hosts are
//! SIGKILLed and restarted, PostgreSQL restarts twice, the network between
//! the hosts and PostgreSQL is cut for ten seconds (a fault proxy), one host
//! is paused past its session timeout (so its partitions move while it
//! lives) and resumed as a zombie, and an operator replays one partition
//! from offset 0. At the end: every good order invoiced exactly once and
//! emailed exactly once, the relay drained, the designed failures (and only
//! they) dead-lettered, every partition's offset at its end, and every offset
//! range committed once (plus the operator's replay). Size: 5,000 events, or
//! INBOXD_CHAOS_EVENTS (`scripts/chaos --full` runs 200,000).

use crate::faults::proxy::{FaultProxy, Mode, Protocol};
use crate::support::*;
use rand::Rng;
use rand::seq::{IndexedRandom, SliceRandom};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

const HOSTS: usize = 3;
/// The records go out in this many chunks, one per chaos step.
const CHUNKS: usize = 10;

/// Produces a chunk (if any) and raises the known end of each partition.
async fn send_chunk(topic: &str, chunk: Option<&[Send]>, ends: &mut HashMap<i32, i64>) {
    if let Some(chunk) = chunk {
        for (partition, end) in produce(topic, chunk).await {
            let known = ends.entry(partition).or_insert(0);
            *known = (*known).max(end);
        }
    }
}
/// The config's session timeout is 6 s; a pause this long makes the group
/// give the paused host's partitions away while it is still alive.
const PAUSE: Duration = Duration::from_secs(9);
/// How long the network between the hosts and PostgreSQL stays cut.
const CUT: Duration = Duration::from_secs(10);

fn signal(host: &HostProcess, signal: i32) {
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    unsafe { libc::kill(host.child.id() as i32, signal) };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_hosts_kills_restarts_zombie_and_replay_stay_exactly_once() {
    chaos(Ordering::Partition).await;
}

/// The same chaos with `ordering = "key"` on billing: orders keyed by
/// customer, ten orders each. A designed failure holds its customer's later
/// orders behind it; at the end the operator discards the failures, which
/// replays the held orders. Nothing lost or doubled, and each customer's
/// orders applied in offset order (by their claims' times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_with_key_order_loses_doubles_and_reorders_nothing() {
    chaos(Ordering::Key).await;
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ordering {
    Partition,
    Key,
}

/// Orders per customer with key order.
const ORDERS_PER_CUSTOMER: usize = 10;

async fn chaos(ordering: Ordering) {
    let events: usize = std::env::var("INBOXD_CHAOS_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let started = Instant::now();
    let cluster = PgCluster::start();
    let (topic, invoices_topic) = (unique("orders"), unique("invoices"));
    create_topic(&topic, 6).await;
    create_topic(&invoices_topic, 6).await;
    let db_url = create_postgres_database(&cluster.admin_url).await;
    // The hosts reach PostgreSQL through a fault proxy; the test's checks go direct.
    let server = db_url
        .split_once('@')
        .unwrap()
        .1
        .split_once('/')
        .unwrap()
        .0
        .to_owned();
    let proxy = FaultProxy::start(server.parse().unwrap(), Protocol::Postgres).await;
    let proxied = db_url.replacen(&server, &proxy.addr().to_string(), 1);
    let mut handlers = chain_handlers(&topic, &invoices_topic);
    if ordering == Ordering::Key {
        // Billing's block comes first, and its outbox mapping is its first inline table.
        handlers = handlers.replacen("outbox_topics = ", "ordering = \"key\"\noutbox_topics = ", 1);
    }
    let customer = |i: usize| format!("c{}", i / ORDERS_PER_CUSTOMER);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("compile-cache");
    let mut env = TestEnv::with_config(dir, proxied, &cache, "billing", &topic, &handlers);
    env.db_url = db_url;

    // 1% of the orders can never succeed (a negative amount: billing rejects them).
    let mut rng = rand::rng();
    let ids: Vec<String> = (0..events).map(|_| new_id()).collect();
    let failing: HashSet<usize> = (0..events).filter(|i| i % 100 == 42).collect();
    let order = |i: usize| {
        let mut send = Send::order(&ids[i], &format!("o{i}"));
        if failing.contains(&i) {
            send.payload = serde_json::json!({
                "event_id": ids[i], "order_id": format!("o{i}"),
                "customer_email": "buyer@example.com", "amount_cents": -1,
            })
            .to_string()
            .into_bytes();
        }
        if ordering == Ordering::Key {
            // Ten consecutive orders per customer: a designed failure is the
            // third of its customer's (in numbers; the stream is shuffled).
            send.key = customer(i);
        }
        send
    };
    let mut records: Vec<Send> = (0..events).map(order).collect();
    let indices: Vec<usize> = (0..events).collect();
    let duplicates = events / 5;
    records.extend((0..duplicates).map(|_| order(*indices.choose(&mut rng).unwrap())));
    // Copies go out mixed in with the originals, as a stream, a chunk per
    // chaos step, so there is always work in flight when something breaks.
    records.shuffle(&mut rng);
    let mut chunks = records.chunks(records.len().div_ceil(CHUNKS));
    let mut ends: HashMap<i32, i64> = HashMap::new();
    send_chunk(&topic, chunks.next(), &mut ends).await;

    let mut hosts: Vec<HostProcess> = (0..HOSTS).map(|_| env.spawn_host()).collect();
    let mut old_logs = String::new();
    let db = env.db().await;
    let progress_now = |db: inboxd::db::Database, handler: String, topic: String| async move {
        progress(&db, &handler, &topic).await.values().sum::<i64>()
    };

    // The plan, one step every few seconds while the hosts work; after it,
    // kills only.
    let (mut kills, mut pg_restarts, mut pauses, mut cuts) = (0, 0, 0, 0);
    let mut replayed: Option<(i32, i64)> = None;
    let mut paused: Option<(usize, Instant)> = None;
    let mut cut: Option<Instant> = None;
    let chaos_deadline = Instant::now() + Duration::from_secs(600);
    let mut step = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(3_000 + rng.random_range(0..1_500))).await;
        if let Some((index, since)) = paused
            && since.elapsed() >= PAUSE
        {
            signal(&hosts[index], libc::SIGCONT);
            paused = None;
        }
        if cut.is_some_and(|since| since.elapsed() >= CUT) {
            proxy.set(Mode::Pass);
            cut = None;
        }
        let plan_finished = kills >= 3
            && pg_restarts == 2
            && pauses == 1
            && cuts == 1
            && replayed.is_some()
            && paused.is_none()
            && cut.is_none();
        // Hosts go on being killed, a step every few seconds, until every
        // record is in and applied (or the deadline passes).
        let drained = plan_finished
            && chunks.len() == 0
            && progress_now(db.clone(), env.handler.clone(), topic.clone()).await
                >= ends.values().sum::<i64>();
        if drained || Instant::now() > chaos_deadline {
            break;
        }
        send_chunk(&topic, chunks.next(), &mut ends).await;
        step += 1;
        match step {
            2 => {
                cluster.restart();
                pg_restarts += 1;
            }
            3 => {
                let index = rng.random_range(0..HOSTS);
                signal(&hosts[index], libc::SIGSTOP);
                paused = Some((index, Instant::now()));
                pauses += 1;
            }
            4 => {
                // The operator rewinds partition 0 to its beginning, as a replay
                // would; the old position says how many records it re-runs.
                let rows = db
                    .query(
                        "WITH old AS (SELECT next_offset FROM offsets WHERE handler = $1 AND topic = $2 AND partition = 0 FOR UPDATE)
                         UPDATE offsets SET next_offset = 0 FROM old
                         WHERE offsets.handler = $1 AND offsets.topic = $2 AND offsets.partition = 0
                         RETURNING old.next_offset",
                        &[env.handler.as_str().into(), topic.as_str().into()],
                    )
                    .await;
                if let Some(old) = rows
                    .ok()
                    .and_then(|r| r.first().and_then(|r| r.first()).and_then(|v| v.as_i64()))
                {
                    replayed = Some((0, old));
                } else {
                    step -= 1; // partition 0 has no stored offset yet: try again next time
                }
            }
            6 => {
                proxy.set(Mode::Cut);
                cut = Some(Instant::now());
                cuts += 1;
            }
            9 => {
                cluster.restart();
                pg_restarts += 1;
            }
            _ => {
                let candidates: Vec<usize> = (0..HOSTS)
                    .filter(|i| paused.is_none_or(|(p, _)| p != *i))
                    .collect();
                let index = *candidates.choose(&mut rng).unwrap();
                hosts[index].kill();
                old_logs.push_str(&hosts[index].log());
                hosts[index] = env.spawn_host();
                kills += 1;
            }
        }
    }
    if let Some((index, _)) = paused {
        signal(&hosts[index], libc::SIGCONT);
    }
    proxy.set(Mode::Pass);
    for chunk in chunks {
        send_chunk(&topic, Some(chunk), &mut ends).await;
    }
    let total: i64 = ends.values().sum();

    let waited = poll_until(Duration::from_secs(600), || {
        let reached = progress_now(db.clone(), env.handler.clone(), topic.clone());
        async move { reached.await >= total }
    })
    .await;
    let logs =
        |hosts: &[HostProcess]| old_logs.clone() + &hosts.iter().map(HostProcess::log).collect::<String>();
    assert!(
        waited,
        "the hosts never reached the end of every partition:\n{}",
        logs(&hosts)
    );
    // With key order, a designed failure holds its customer's later orders:
    // the operator discards the failures, which replays what they held.
    let mut held_replayed = 0;
    if ordering == Ordering::Key {
        let parked = rows(
            &db,
            "SELECT id FROM dead_letters WHERE handler = 'billing' AND resolution IS NULL \
             AND reason_kind <> 'held' ORDER BY id",
        )
        .await;
        let parked: Vec<String> = parked
            .iter()
            .map(|r| r[0].as_i64().unwrap().to_string())
            .collect();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_inboxd"))
            .args(["dlq", "discard"])
            .args(&parked)
            .args(["--json", "--config"])
            .arg(&env.config_path)
            .output()
            .expect("run inboxd dlq discard");
        let said: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert!(
            out.status.success(),
            "{said}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        held_replayed = said
            .as_array()
            .expect("a list")
            .iter()
            .filter(|o| o["outcome"] == "replayed")
            .count();
    }
    // The chain drains: every invoice relayed, and emailed.
    let emails = db.handler_table("notifier", "emails");
    let good_orders = (0..events).filter(|i| !failing.contains(i)).count() as i64;
    let drained = poll_until(Duration::from_secs(600), || {
        let (db, emails) = (db.clone(), emails.clone());
        async move {
            let backlog = inboxd::db::outbox::backlog(&db, "billing")
                .await
                .map_or(1, |(n, _)| n);
            let sent = db
                .query_i64(&format!("SELECT COUNT(*) FROM {emails}"), &[])
                .await
                .unwrap_or(0);
            backlog == 0 && sent >= good_orders
        }
    })
    .await;
    assert!(
        drained,
        "the relay and notifier never caught up:\n{}",
        logs(&hosts)
    );
    let logs = logs(&hosts);
    for host in &mut hosts {
        assert!(host.is_running(), "a host died on its own:\n{logs}");
        assert_eq!(host.terminate(Duration::from_secs(60)).await, Some(0));
    }

    let db = env.db().await;
    let invoices = db.handler_table("billing", "invoices");
    let applied = rows(&db, &format!("SELECT event_id FROM {invoices}")).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for row in &applied {
        *seen.entry(row[0].as_str().unwrap().to_owned()).or_default() += 1;
    }
    let good: HashSet<&String> = (0..events)
        .filter(|i| !failing.contains(i))
        .map(|i| &ids[i])
        .collect();
    let lost = good.iter().filter(|id| !seen.contains_key(**id)).count();
    let doubled = seen.values().filter(|n| **n > 1).count();
    let strays = seen.keys().filter(|id| !good.contains(id)).count();
    // Every letter, resolved or not, but those held behind a designed failure.
    let letters = rows(
        &db,
        "SELECT event_id, resolution FROM dead_letters WHERE handler = 'billing' AND reason_kind <> 'held'",
    )
    .await;
    let dead: HashSet<String> = letters
        .iter()
        .filter_map(|l| l[0].as_str().map(str::to_owned))
        .collect();
    let designed: HashSet<String> = failing.iter().map(|i| ids[*i].clone()).collect();
    let positions = inboxd::db::offsets::load_all(&db, "billing").await.unwrap();
    let stored: HashMap<i32, i64> = positions.iter().map(|p| (p.partition, p.next_offset)).collect();
    let mailed = rows(&db, &format!("SELECT order_id FROM {emails}")).await;
    let mut emailed: HashMap<String, usize> = HashMap::new();
    for row in &mailed {
        *emailed.entry(row[0].as_str().unwrap().to_owned()).or_default() += 1;
    }
    let good_order_ids: HashSet<String> = (0..events)
        .filter(|i| !failing.contains(i))
        .map(|i| format!("o{i}"))
        .collect();
    let emails_lost = good_order_ids
        .iter()
        .filter(|o| !emailed.contains_key(*o))
        .count();
    let emails_doubled = emailed.values().filter(|n| **n > 1).count();
    let emails_strays = emailed.keys().filter(|o| !good_order_ids.contains(*o)).count();
    println!(
        "chaos: events={events} records={} duplicates={duplicates} designed_failures={} kills={kills} \
         pg_restarts={pg_restarts} network_cuts={cuts} pauses={pauses} replayed_partition0_records={} \
         effects={} emails={} lost={} doubled={} dead_letters={} wall_s={:.1}",
        records.len(),
        designed.len(),
        replayed.map_or(0, |r| r.1),
        applied.len(),
        mailed.len(),
        lost + emails_lost,
        doubled + emails_doubled,
        letters.len(),
        started.elapsed().as_secs_f64()
    );
    if ordering == Ordering::Key {
        let out_of_order = customers_out_of_order(&db, &ids, customer).await;
        println!(
            "chaos (ordering = key): held_then_replayed={held_replayed} customers_out_of_order={}",
            out_of_order.len()
        );
        assert!(held_replayed > 0, "no order was held behind a designed failure");
        assert_eq!(
            out_of_order,
            Vec::<String>::new(),
            "customers whose orders were applied out of order"
        );
        let unresolved = count(
            &db,
            "SELECT COUNT(*) FROM dead_letters WHERE handler = 'billing' AND resolution IS NULL",
        )
        .await;
        assert_eq!(unresolved, 0, "the operator's discard left letters parked");
        let held = count(
            &db,
            "SELECT COUNT(*) FROM dead_letters WHERE handler = 'billing' AND reason_kind = 'held' \
             AND resolution = 'replayed'",
        )
        .await;
        assert_eq!(held, held_replayed as i64, "each held order replayed once");
    }
    assert_eq!(
        (emails_lost, emails_doubled, emails_strays),
        (0, 0, 0),
        "one email per good order"
    );
    assert!(
        kills >= 1 && pg_restarts == 2 && pauses == 1 && cuts == 1,
        "the chaos plan did not run: kills={kills}"
    );
    assert_eq!(
        (lost, doubled, strays),
        (0, 0, 0),
        "effects must be exactly the good events, once each"
    );
    assert_eq!(applied.len(), good.len());
    assert_eq!(dead, designed, "dead letters are exactly the designed failures");
    assert_eq!(
        letters.len(),
        designed.len(),
        "each designed failure dead-lettered once"
    );
    assert_eq!(stored, ends, "every partition's stored offset reached the end");
    // With key order, records settled again after a crash (skipped as
    // duplicates) count again: each range is committed once per settling.
    for p in positions.iter().filter(|_| ordering == Ordering::Partition) {
        let replay = replayed
            .filter(|(partition, _)| *partition == p.partition)
            .map_or(0, |r| r.1);
        assert_eq!(
            p.records_committed,
            p.next_offset + replay,
            "partition {}: an offset range committed twice",
            p.partition
        );
    }
}

/// Customers whose applied orders, in offset order, were not claimed in
/// that order (by their claims' commit times, in microseconds: ties pass).
async fn customers_out_of_order(
    db: &inboxd::db::Database,
    ids: &[String],
    customer: impl Fn(usize) -> String,
) -> Vec<String> {
    let of: HashMap<&str, String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), customer(i)))
        .collect();
    // Ordered by when each claim's transaction committed, not by its
    // `processed_at`: that is taken when a batch sends its claims, and a
    // claim that waited on another host's row lock (a paused host's batch
    // overlapping its successor's under key order) lands with the earlier
    // time although it committed, and its effects applied, after (seen
    // once in CI as `customers_out_of_order=1`).
    let claims = rows(
        db,
        "SELECT event_id, \"offset\", \
         (extract(epoch FROM pg_catalog.pg_xact_commit_timestamp(xmin)) * 1000000)::bigint \
         FROM inbox WHERE handler = 'billing' AND status = 'done'",
    )
    .await;
    let mut by_customer: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    for claim in &claims {
        let id = claim[0].as_str().unwrap();
        if let Some(customer) = of.get(id) {
            by_customer
                .entry(customer.clone())
                .or_default()
                .push((claim[1].as_i64().unwrap(), claim[2].as_i64().unwrap()));
        }
    }
    let mut wrong: Vec<String> = by_customer
        .into_iter()
        .filter_map(|(customer, mut claims)| {
            claims.sort();
            claims.windows(2).any(|w| w[1].1 < w[0].1).then_some(customer)
        })
        .collect();
    wrong.sort();
    wrong
}
