//! `ordering = "key"`: a key whose record fails waits alone while the
//! partition's other keys commit, its later records are held behind its
//! dead letter (never applied before it), and replaying that letter applies
//! them once each, in offset order.

use crate::on_both_backends;
use crate::support::*;
use inboxd::db::SqlValue;
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

/// A record of Kafka key `key` (the event id is its own).
fn keyed(key: &str, body: serde_json::Value) -> (String, Send) {
    let id = new_id();
    let mut send = Send::json(&id, body);
    send.key = key.to_owned();
    (id, send)
}

fn texts(rows: Vec<Vec<SqlValue>>) -> Vec<String> {
    rows.into_iter()
        .map(|row| match &row[0] {
            SqlValue::Text(text) => text.clone(),
            other => panic!("text, not {other:?}"),
        })
        .collect()
}

on_both_backends!(a_failing_key_waits_alone_and_its_later_records_are_held_behind_it);

async fn a_failing_key_waits_alone_and_its_later_records_are_held_behind_it(backend: Backend) {
    let topic = unique("keyed");
    // One partition: with partition order, every record would wait for a1.
    create_topic(&topic, 1).await;
    // a1 asks for a retry until its third attempt; two are allowed, with a
    // backoff of 1.5-3 s between: it is parked after it.
    let settings = "ordering = \"key\"\n[handlers.retry]\nmax_attempts = 2\n\
                    backoff_initial_ms = 3000\nbackoff_max_ms = 3000\n";
    let env = TestEnv::new(backend, "hostile", &topic, settings).await;
    let ok = || json!({ "attack": "ok" });
    let (a1, send_a1) = keyed("a", json!({ "attack": "until", "attempt": 3 }));
    let (a2, send_a2) = keyed("a", ok());
    let (a3, send_a3) = keyed("a", ok());
    let (others, mut sends): (Vec<String>, Vec<Send>) =
        (0..20).map(|i| keyed(&format!("b{}", i % 7), ok())).unzip();
    let mut later = sends.split_off(10);
    let mut records = vec![send_a1, send_a2];
    records.append(&mut sends);
    records.push(send_a3);
    records.append(&mut later);
    let ends = produce(&topic, &records).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;

    let db = env.db().await;
    let effects = env.table("hostile_effects").await;
    let applied = |db: inboxd::db::Database| {
        let sql = format!("SELECT event_id FROM {effects}");
        async move { texts(rows(&db, &sql).await) }
    };
    let others: BTreeSet<String> = others.into_iter().collect();
    let now: Vec<String> = applied(db.clone()).await;
    assert_eq!(
        now.iter().cloned().collect::<BTreeSet<_>>(),
        others,
        "the other keys applied, none of key a (a1 parked, a2 and a3 held behind it)"
    );
    assert_eq!(now.len(), others.len(), "each once");

    // a1 was parked after its backoff; the other keys of its partition had
    // committed before that, while it waited.
    let letters = rows(
        &db,
        "SELECT id, event_id, reason_kind, reason, last_failed_at FROM dead_letters ORDER BY \"offset\"",
    )
    .await;
    assert_eq!(letters.len(), 3, "a1 and the two held behind it: {letters:?}");
    let first = letters[0][0].as_i64().expect("id");
    let parked_at = letters[0][4].as_i64().expect("last_failed_at");
    let kinds: Vec<(String, String, String)> = letters
        .iter()
        .map(|l| {
            let text = |v: &SqlValue| v.as_str().unwrap_or_default().to_owned();
            (text(&l[1]), text(&l[2]), text(&l[3]))
        })
        .collect();
    assert_eq!(kinds[0].0, a1);
    assert_eq!(kinds[0].1, "retries-exhausted", "{kinds:?}");
    let behind = format!("held behind dead letter {first}");
    assert_eq!(
        kinds[1..].to_vec(),
        vec![
            (a2.clone(), "held".to_owned(), behind.clone()),
            (a3.clone(), "held".to_owned(), behind)
        ]
    );
    let ids = others
        .iter()
        .map(|id| format!("'{id}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let last_other = count(
        &db,
        &format!("SELECT MAX(processed_at) FROM inbox WHERE event_id IN ({ids})"),
    )
    .await;
    assert!(
        last_other < parked_at,
        "the other keys committed during a1's backoff ({last_other} >= {parked_at})"
    );

    // Replaying a1 (its third attempt succeeds) releases a2 and a3 after it.
    let replayed = std::process::Command::new(env!("CARGO_BIN_EXE_inboxd"))
        .args(["dlq", "replay", &first.to_string(), "--json", "--config"])
        .arg(&env.config_path)
        .output()
        .expect("run inboxd dlq replay");
    let said: serde_json::Value = serde_json::from_slice(&replayed.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&replayed.stderr)));
    let outcomes: Vec<(i64, String)> = said
        .as_array()
        .expect("a list")
        .iter()
        .map(|o| {
            (
                o["id"].as_i64().unwrap(),
                o["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let letter_ids: Vec<i64> = letters.iter().map(|l| l[0].as_i64().unwrap()).collect();
    assert_eq!(
        outcomes,
        letter_ids
            .iter()
            .map(|id| (*id, "replayed".to_owned()))
            .collect::<Vec<_>>(),
        "a1, then a2 and a3 in offset order: {said}"
    );
    let after = applied(db.clone()).await;
    assert_eq!(after.len(), others.len() + 3, "each once: {after:?}");
    let mut all = others.clone();
    all.extend([a1, a2, a3]);
    assert_eq!(after.into_iter().collect::<BTreeSet<_>>(), all);
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM dead_letters WHERE resolution IS NULL").await,
        0,
        "nothing is left parked"
    );
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}

/// Keys and records per key of [`each_key_stays_in_order_through_a_sigkill_and_a_second_host`].
const KEYS: usize = 24;
const PER_KEY: usize = 25;

/// Record `n` of key `k`: it writes `k:n:<rows of k so far>`, so a key
/// applied in order writes `k:n:n` for each n, once.
fn numbered(key: usize, n: usize) -> Send {
    let k = format!("k{key}");
    let statement = format!(
        "INSERT INTO hostile_effects (event_id) SELECT '{k}:{n}:' || COUNT(*) FROM hostile_effects \
         WHERE event_id >= '{k}:' AND event_id < '{k};'"
    );
    keyed(&k, json!({ "attack": "sql", "statement": statement })).1
}

on_both_backends!(each_key_stays_in_order_through_a_sigkill_and_a_second_host);

async fn each_key_stays_in_order_through_a_sigkill_and_a_second_host(backend: Backend) {
    let topic = unique("keyed");
    create_topic(&topic, 3).await;
    let env = TestEnv::new(backend, "hostile", &topic, "ordering = \"key\"\n").await;
    // Round robin over the keys, and every 5th record sent twice.
    let mut records = Vec::new();
    for n in 0..PER_KEY {
        for key in 0..KEYS {
            records.push(numbered(key, n));
            if (n * KEYS + key).is_multiple_of(5) {
                let copy = records.last().expect("just pushed");
                records.push(Send {
                    key: copy.key.clone(),
                    event_id_header: copy.event_id_header.clone(),
                    payload: copy.payload.clone(),
                    traceparent: None,
                });
            }
        }
    }
    let ends = produce(&topic, &records).await;
    let total: i64 = ends.values().sum();

    let mut host = env.spawn_host();
    let db = env.db().await;
    assert!(
        wait_for_progress(&env, &topic, total / 5).await,
        "no progress before the kill:\n{}",
        host.log()
    );
    host.kill();
    let at_kill: i64 = stored_offsets(&db, &env.handler, &topic).await.values().sum();
    assert!(
        at_kill < total,
        "the kill came after the end; the test proved nothing"
    );

    let mut restarted = env.spawn_host();
    // On PostgreSQL a second host joins, and the partitions are split
    // between the two mid-stream (SQLite, the embedded backend, is one
    // host's: there the restart alone).
    let mut second = (backend == Backend::Postgres).then(|| env.spawn_host());
    env.wait_for_offsets(&ends, Duration::from_secs(180), &mut restarted)
        .await;
    if let Some(second) = &mut second {
        assert_eq!(second.terminate(Duration::from_secs(30)).await, Some(0));
    }
    assert_eq!(restarted.terminate(Duration::from_secs(30)).await, Some(0));

    let effects = env.table("hostile_effects").await;
    let mut written = texts(rows(&db, &format!("SELECT event_id FROM {effects}")).await);
    written.sort();
    let mut expected: Vec<String> = (0..KEYS)
        .flat_map(|key| (0..PER_KEY).map(move |n| format!("k{key}:{n}:{n}")))
        .collect();
    expected.sort();
    let wrong: Vec<&String> = written.iter().filter(|w| !expected.contains(w)).collect();
    assert!(
        wrong.is_empty(),
        "records applied out of their key's order or twice: {wrong:?}"
    );
    assert_eq!(written, expected, "each record once, each key in order");
    assert_eq!(count(&db, "SELECT COUNT(*) FROM dead_letters").await, 0);
}

on_both_backends!(a_handler_at_its_held_bound_takes_no_more_records_until_an_operator_makes_room);

async fn a_handler_at_its_held_bound_takes_no_more_records_until_an_operator_makes_room(backend: Backend) {
    let topic = unique("keyed");
    create_topic(&topic, 1).await;
    let env = TestEnv::new(
        backend,
        "hostile",
        &topic,
        "ordering = \"key\"\nmax_held_records = 2\n",
    )
    .await;
    let ok = || json!({ "attack": "ok" });
    // a1 is parked; a2 and a3 are held (the bound); a4 would pass it.
    let (_, a1) = keyed("a", json!({ "attack": "reject" }));
    let (a2, send_a2) = keyed("a", ok());
    let (a3, send_a3) = keyed("a", ok());
    let (a4, send_a4) = keyed("a", ok());
    let (after, sends): (Vec<String>, Vec<Send>) = (0..10).map(|i| keyed(&format!("b{i}"), ok())).unzip();
    let mut records = vec![a1, send_a2, send_a3, send_a4];
    records.extend(sends);
    let ends = produce(&topic, &records).await;
    let mut host = env.spawn_host();
    let db = env.db().await;
    let stopped = poll_until(Duration::from_secs(60), || {
        let log = host.log();
        async move { log.contains("holds as many records behind dead letters as it may") }
    })
    .await;
    assert!(stopped, "the handler never reached its bound:\n{}", host.log());
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM dead_letters WHERE reason_kind = 'held'"
        )
        .await,
        2,
        "held up to the bound, no more"
    );
    let end = ends[&0];
    assert!(
        stored_offsets(&db, &env.handler, &topic).await[&0] < end,
        "the handler went on past its bound"
    );

    // The operator discards a1 and what it holds: the handler goes on, and
    // a4 (its key free again) and the rest are applied.
    let first = count(&db, "SELECT MIN(id) FROM dead_letters").await;
    let discarded = std::process::Command::new(env!("CARGO_BIN_EXE_inboxd"))
        .args([
            "dlq",
            "discard",
            &first.to_string(),
            "--held",
            "discard",
            "--config",
        ])
        .arg(&env.config_path)
        .output()
        .expect("run inboxd dlq discard");
    assert!(
        discarded.status.success(),
        "{}",
        String::from_utf8_lossy(&discarded.stderr)
    );
    env.wait_for_offsets(&ends, Duration::from_secs(60), &mut host)
        .await;
    let effects = env.table("hostile_effects").await;
    let applied: BTreeSet<String> = texts(rows(&db, &format!("SELECT event_id FROM {effects}")).await)
        .into_iter()
        .collect();
    let mut expected: BTreeSet<String> = after.into_iter().collect();
    expected.insert(a4);
    assert_eq!(applied, expected, "a2 and a3 discarded, the rest applied once");
    assert!(!applied.contains(&a2) && !applied.contains(&a3));
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}

on_both_backends!(records_without_a_key_keep_partition_order_among_themselves);

async fn records_without_a_key_keep_partition_order_among_themselves(backend: Backend) {
    let topic = unique("keyed");
    create_topic(&topic, 1).await;
    let settings = "ordering = \"key\"\n[handlers.retry]\nmax_attempts = 3\n\
                    backoff_initial_ms = 3000\nbackoff_max_ms = 3000\n";
    let env = TestEnv::new(backend, "hostile", &topic, settings).await;
    let ok = || json!({ "attack": "ok" });
    // n1 has no key and asks for one retry; n2 and n3, also without a key,
    // must wait for it; the keyed records after them need not.
    let (n1, send_n1) = keyed("", json!({ "attack": "until", "attempt": 2 }));
    let (n2, send_n2) = keyed("", ok());
    let (n3, send_n3) = keyed("", ok());
    let (others, sends): (Vec<String>, Vec<Send>) = (0..10).map(|i| keyed(&format!("b{i}"), ok())).unzip();
    let mut records = vec![send_n1, send_n2, send_n3];
    records.extend(sends);
    let ends = produce(&topic, &records).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));

    let db = env.db().await;
    let claimed_at = |ids: Vec<String>| {
        let db = db.clone();
        let list = ids
            .iter()
            .map(|id| format!("'{id}'"))
            .collect::<Vec<_>>()
            .join(", ");
        async move {
            rows(
                &db,
                &format!("SELECT processed_at FROM inbox WHERE event_id IN ({list}) AND status = 'done'"),
            )
            .await
            .iter()
            .map(|r| r[0].as_i64().expect("processed_at"))
            .collect::<Vec<i64>>()
        }
    };
    let first = claimed_at(vec![n1.clone()]).await;
    let after = claimed_at(vec![n2.clone(), n3.clone()]).await;
    let keyed_ones = claimed_at(others.clone()).await;
    assert_eq!(
        (first.len(), after.len(), keyed_ones.len()),
        (1, 2, 10),
        "each applied once"
    );
    assert!(
        after.iter().all(|at| *at >= first[0]),
        "records without a key went ahead of the one without a key before them: {after:?} < {first:?}"
    );
    assert!(
        keyed_ones.iter().all(|at| *at < first[0]),
        "the keyed records waited for the one without a key: {keyed_ones:?} >= {first:?}"
    );
    let effects = env.table("hostile_effects").await;
    assert_eq!(count(&db, &format!("SELECT COUNT(*) FROM {effects}")).await, 13);
}
