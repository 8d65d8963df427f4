//! `inboxd dlq`: dead letters can be listed, shown, replayed (at most once,
//! even by two operators at the same moment) and discarded.

use crate::on_both_backends;
use crate::support::*;
use inboxd::db::SqlValue;
use serde_json::{Value, json};
use std::process::{Command, Output};
use std::time::Duration;

fn dlq(env: &TestEnv, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inboxd"))
        .arg("dlq")
        .args(args)
        .arg("--config")
        .arg(&env.config_path)
        .output()
        .expect("run inboxd dlq")
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

on_both_backends!(dead_letters_are_listed_replayed_once_and_discarded);

async fn dead_letters_are_listed_replayed_once_and_discarded(backend: Backend) {
    let topic = unique("flaky");
    create_topic(&topic, 1).await;
    let retry = "[handlers.retry]\nmax_attempts = 2\nbackoff_initial_ms = 10\nbackoff_max_ms = 20";
    let env = TestEnv::new(backend, "hostile", &topic, retry).await;
    let (a, b, c) = (new_id(), new_id(), new_id());
    let records = vec![
        Send::json(&a, json!({ "attack": "until", "attempt": 3 })),
        Send::json(&b, json!({ "attack": "until", "attempt": 3 })),
        Send::json(&c, json!({ "attack": "reject" })),
        Send {
            key: "k".into(),
            event_id_header: None,
            payload: b"no id here".to_vec(),
            traceparent: None,
        },
    ];
    let ends = produce(&topic, &records).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));

    let listed = json_of(&dlq(&env, &["list", "--json"]));
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 4, "{listed:#?}");
    let id_of = |event: &str| {
        listed.iter().find(|l| l["event_id"] == event).unwrap()["id"]
            .as_i64()
            .unwrap()
    };
    let (id_a, id_b, id_c) = (id_of(&a), id_of(&b), id_of(&c));
    let id_none = listed.iter().find(|l| l["event_id"].is_null()).unwrap()["id"]
        .as_i64()
        .unwrap();
    assert_eq!(
        listed.iter().find(|l| l["id"] == id_a).unwrap()["kind"],
        "retries-exhausted"
    );
    assert_eq!(
        listed.iter().find(|l| l["id"] == id_c).unwrap()["kind"],
        "rejected"
    );

    let shown = json_of(&dlq(&env, &["show", &id_a.to_string(), "--json"]));
    assert_eq!(shown["attempts"], 2);
    assert_eq!(shown["topic"], topic.as_str());
    assert!(
        shown["payload"].as_str().unwrap().contains("\"until\""),
        "{shown:#}"
    );
    assert!(shown["handler_version"].as_str().is_some_and(|v| v.len() == 12));

    // Two operators replay the same dead letter at the same moment.
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_inboxd"))
            .args(["dlq", "replay", &id_a.to_string(), "--json", "--config"])
            .arg(&env.config_path)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn replay")
    };
    let (first, second) = (spawn(), spawn());
    let outcomes: Vec<String> = [first, second]
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            json_of(&output)[0]["outcome"].as_str().unwrap().to_owned()
        })
        .collect();
    // Exactly one replays it. The other found the claim taken (it raced) or,
    // if it started a moment later, the dead letter already resolved.
    assert_eq!(
        outcomes.iter().filter(|o| *o == "replayed").count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .any(|o| o == "already-applied" || o == "already-resolved"),
        "{outcomes:?}"
    );

    // Replaying everything: b succeeds, c is rejected again, the id-less one cannot run.
    let all = dlq(&env, &["replay", "--handler", "hostile", "--all", "--json"]);
    assert_eq!(all.status.code(), Some(1), "a failed replay is a failure");
    let all = json_of(&all);
    let outcome_of =
        |id: i64| all.as_array().unwrap().iter().find(|o| o["id"] == id).unwrap()["outcome"].clone();
    assert_eq!(outcome_of(id_b), "replayed");
    assert_eq!(outcome_of(id_c), "failed");
    assert_eq!(outcome_of(id_none), "no-event-id");

    let db = env.db().await;
    let effects = env.table("hostile_effects").await;
    let mut applied = rows(&db, &format!("SELECT event_id FROM {effects}")).await;
    applied.sort_by(|x, y| x[0].as_str().cmp(&y[0].as_str()));
    let mut expected = vec![vec![SqlValue::Text(a.clone())], vec![SqlValue::Text(b.clone())]];
    expected.sort_by(|x, y| x[0].as_str().cmp(&y[0].as_str()));
    assert_eq!(applied, expected, "each replayed event applied exactly once");
    let replayed_again = json_of(&dlq(&env, &["replay", &id_a.to_string(), "--json"]));
    assert_eq!(replayed_again[0]["outcome"], "already-resolved");

    let discarded = dlq(&env, &["discard", &id_c.to_string(), &id_none.to_string()]);
    assert!(
        discarded.status.success(),
        "{}",
        String::from_utf8_lossy(&discarded.stderr)
    );
    assert_eq!(
        json_of(&dlq(&env, &["list", "--json"])).as_array().unwrap().len(),
        0,
        "nothing left parked"
    );
    assert_eq!(
        json_of(&dlq(&env, &["list", "--all", "--json"]))
            .as_array()
            .unwrap()
            .len(),
        4
    );

    let missing = dlq(&env, &["show", "999999"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no dead letter with id 999999"));
    let text = String::from_utf8_lossy(&dlq(&env, &["list", "--all"]).stdout).into_owned();
    assert!(
        text.contains("retries-exhausted (replayed)") && text.contains("rejected (discarded)"),
        "{text}"
    );
}

on_both_backends!(a_group_of_a_thousand_dead_letters_is_replayed_once_each_and_another_discarded);

/// `inboxd dlq groups`: 1,000 events that ran out of retries for one cause
/// are one group (their reasons differ only in numbers), replayed together;
/// each is applied once and reported by id. Rejections whose reasons differ
/// only in a quoted value are a second group, discarded together.
async fn a_group_of_a_thousand_dead_letters_is_replayed_once_each_and_another_discarded(backend: Backend) {
    let topic = unique("groups");
    create_topic(&topic, 3).await;
    let retry = "[handlers.retry]\nmax_attempts = 2\nbackoff_initial_ms = 1\nbackoff_max_ms = 2";
    let env = TestEnv::new(backend, "hostile", &topic, retry).await;
    // Each needs a third attempt: after 2 it is parked ("attempt 2 of 3"),
    // and its replay is that third attempt.
    let mut records: Vec<Send> = (0..1000)
        .map(|_| Send::json(&new_id(), json!({ "attack": "until", "attempt": 3 })))
        .collect();
    let unknown: Vec<String> = (0..5).map(|_| new_id()).collect();
    for (i, id) in unknown.iter().enumerate() {
        records.push(Send::json(id, json!({ "attack": format!("nonsense-{i}") })));
    }
    let ends = produce(&topic, &records).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(180), &mut host)
        .await;
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));

    let groups = json_of(&dlq(&env, &["groups", "--json"]));
    let groups = groups.as_array().unwrap();
    assert_eq!(groups.len(), 2, "{groups:#?}");
    let (retried, unknown_group) = (&groups[0], &groups[1]);
    assert_eq!(retried["count"], 1000, "the largest group first");
    assert_eq!(retried["kind"], "retries-exhausted");
    assert!(
        retried["pattern"].as_str().unwrap().contains("attempt # of #"),
        "{retried:#}"
    );
    assert_eq!(unknown_group["count"], 5);
    assert_eq!(unknown_group["kind"], "rejected");
    assert_eq!(
        unknown_group["pattern"],
        r#"handler rejected the event: unknown attack "…""#
    );
    let text = String::from_utf8_lossy(&dlq(&env, &["groups"]).stdout).into_owned();
    assert!(
        text.contains(retried["id"].as_str().unwrap()) && text.contains("1000"),
        "{text}"
    );

    let replayed = dlq(
        &env,
        &["replay", "--group", retried["id"].as_str().unwrap(), "--json"],
    );
    assert!(
        replayed.status.success(),
        "{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    let replayed = json_of(&replayed);
    let replayed = replayed.as_array().unwrap();
    assert_eq!(replayed.len(), 1000, "every member reported");
    assert!(
        replayed.iter().all(|o| o["outcome"] == "replayed"),
        "{replayed:?}"
    );
    let mut reported: Vec<i64> = replayed.iter().map(|o| o["id"].as_i64().unwrap()).collect();
    reported.sort_unstable();
    reported.dedup();
    assert_eq!(reported.len(), 1000, "each member once");

    let db = env.db().await;
    let effects = env.table("hostile_effects").await;
    assert_eq!(count(&db, &format!("SELECT COUNT(*) FROM {effects}")).await, 1000);
    assert_eq!(
        count(&db, &format!("SELECT COUNT(DISTINCT event_id) FROM {effects}")).await,
        1000,
        "each replayed event applied exactly once"
    );
    // Replaying the group again finds nothing: its members are resolved.
    let again = dlq(&env, &["replay", "--group", retried["id"].as_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("no group of parked dead letters"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    let discarded = dlq(
        &env,
        &[
            "discard",
            "--group",
            unknown_group["id"].as_str().unwrap(),
            "--json",
        ],
    );
    assert!(discarded.status.success());
    let discarded = json_of(&discarded);
    assert_eq!(discarded.as_array().unwrap().len(), 5);
    assert!(
        discarded
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["discarded"] == true)
    );
    assert_eq!(json_of(&dlq(&env, &["groups", "--json"])), json!([]));
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM dead_letters WHERE resolution = 'discarded'"
        )
        .await,
        5
    );
    assert_eq!(count(&db, &format!("SELECT COUNT(*) FROM {effects}")).await, 1000);
}
