//! A team's path with the inboxd binary alone: `inboxd new`, `inboxd build`,
//! `inboxd test --expect`, then `inboxd deploy` over HTTPS (a private CA, with
//! `--ca-cert`) to a host on the real broker and PostgreSQL. One event sent
//! twice is applied once; a changed handler deployed as version 2 applies the
//! next one. Broken handlers (a trap, a refused statement, a wrong export)
//! fail `inboxd test` or `inboxd check` with what a user needs to read.
//!
//! One test per language; each starts from an empty folder and installs its
//! toolchain's pinned tools itself (componentize-py, jco) on first use.

use super::tls::front;
use super::*;
use serde_json::json;
use std::path::PathBuf;
use std::process::Output;

async fn inboxd(dir: &Path, args: &[&str], vars: &[(&str, &str)]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_inboxd"))
        .args(args)
        .current_dir(dir)
        .envs(vars.iter().copied())
        .output()
        .await
        .expect("run the inboxd CLI")
}

/// stdout of a command that must succeed.
fn ok(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The text a team reads of a command that must fail.
fn refused(out: &Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{what} should have failed:\n{text}");
    text
}

/// The same statement in every template; version 2 changes it.
const INSERT: &str = "VALUES ($1, $2, $3)";
const INSERT_V2: &str = "VALUES (upper($1), $2, $3)";

fn source(folder: &Path, template: &str) -> PathBuf {
    folder.join(match template {
        "rust" => "src/lib.rs",
        "python" => "app.py",
        _ => "handler.js",
    })
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).expect("read the handler");
    assert!(text.contains(from), "{} has no {from:?}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).expect("write the handler");
}

/// Rust builds share one target folder across runs; the other languages
/// install their tools inside the handler's folder, as a team's would.
fn build_vars(template: &str) -> Vec<(&'static str, String)> {
    match template {
        "rust" => vec![(
            "CARGO_TARGET_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join("authoring-rust")
                .display()
                .to_string(),
        )],
        _ => Vec::new(),
    }
}

async fn build(folder: &Path, template: &str, name: &str) {
    let vars = build_vars(template);
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let started = std::time::Instant::now();
    let out = ok(&inboxd(folder, &["build"], &vars).await, "inboxd build");
    eprintln!(
        "{template}: inboxd build took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        out.contains(&format!("ok: handler {name} would be accepted")),
        "{out}"
    );
}

async fn test_json(folder: &Path, wasm: &str, events: &str, expect: Option<&str>) -> (Output, Value) {
    let mut args = vec![
        "test",
        wasm,
        "--migrations",
        "migrations",
        "--settings",
        "settings.json",
        "--events",
        events,
        "--json",
    ];
    if let Some(expect) = expect {
        args.extend(["--expect", expect]);
    }
    let out = inboxd(folder, &args, &[]).await;
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "inboxd test --json printed no JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, report)
}

async fn orders(admin: &Admin, name: &str) -> Vec<String> {
    let db = admin.env.db().await;
    let table = db.handler_table(name, &format!("{name}_orders"));
    let mut ids: Vec<String> = rows(&db, &format!("SELECT order_id FROM {table}"))
        .await
        .into_iter()
        .map(|row| row[0].as_str().expect("order_id").to_owned())
        .collect();
    ids.sort();
    ids
}

async fn send_order(topic: &str, order_id: &str, copies: usize) -> std::collections::HashMap<i32, i64> {
    let id = new_id();
    let record = || Send {
        key: order_id.to_owned(),
        event_id_header: Some(id.clone()),
        payload: json!({ "order_id": order_id, "amount_cents": 100 })
            .to_string()
            .into_bytes(),
        traceparent: None,
    };
    let records: Vec<Send> = (0..copies).map(|_| record()).collect();
    produce(topic, &records).await
}

async fn journey(template: &str) {
    let work = tempfile::tempdir().expect("tempdir");
    let name = format!("shop_{template}");
    let started = std::time::Instant::now();
    ok(
        &inboxd(work.path(), &["new", template, &name], &[]).await,
        "inboxd new",
    );
    let folder = work.path().join(&name);
    build(&folder, template, &name).await;
    let wasm = format!("target/{name}.wasm");
    let (out, report) = test_json(&folder, &wasm, "events.jsonl", Some("expected.json")).await;
    ok(&out, "inboxd test --expect");
    assert_eq!(report["expect"]["ok"], true, "{report}");
    assert_eq!(
        report["outcomes"],
        json!({ "applied": 2, "duplicate": 1, "parked": 2 }),
        "{report}"
    );

    // A host with its admin API behind TLS.
    let topic = unique("authoring");
    let recorded = unique("recorded");
    create_topic(&topic, 1).await;
    create_topic(&recorded, 1).await;
    let mut admin = start(Backend::Postgres, &topic, "").await;
    admin.env.handler = name.clone();
    let tls = front(admin.url.trim_start_matches("http://"), admin.env.dir.path()).await;
    let mut settings: Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("settings.json")).unwrap()).unwrap();
    settings["group_id"] = team_group(&name).into();
    settings["outbox_topics"] = json!({ "orders.recorded": recorded });
    let deploy_settings = folder.join("deploy.json");
    std::fs::write(&deploy_settings, settings.to_string()).unwrap();
    let deploy_settings = deploy_settings.display().to_string();
    let deploy = |ca: bool| {
        let mut args = vec![
            "deploy".to_owned(),
            wasm.clone(),
            "--name".into(),
            name.clone(),
            "--topic".into(),
            topic.clone(),
            "--migrations".into(),
            "migrations".into(),
            "--settings".into(),
            deploy_settings.clone(),
            "--server".into(),
            tls.url.clone(),
        ];
        if ca {
            args.extend(["--ca-cert".into(), tls.ca_pem.display().to_string()]);
        }
        let folder = folder.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            inboxd(&folder, &args, &[("INBOXD_TOKEN", OPS_TOKEN)]).await
        }
    };
    let untrusted = refused(
        &deploy(false).await,
        "deploy to a certificate no root vouches for",
    );
    assert!(untrusted.contains("certificate"), "{untrusted}");
    let deployed = ok(&deploy(true).await, "inboxd deploy over HTTPS");
    assert!(
        deployed.contains(&format!("{name} version 1 uploaded and active")),
        "{deployed}"
    );
    eprintln!(
        "{template}: empty folder to a deployed handler in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // One event, sent twice: applied once.
    let ends = send_order(&topic, "o-10", 2).await;
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;
    assert_eq!(orders(&admin, &name).await, ["o-10"]);

    // Version 2 applies the next one.
    edit(&source(&folder, template), INSERT, INSERT_V2);
    build(&folder, template, &name).await;
    let deployed = ok(&deploy(true).await, "inboxd deploy of version 2");
    assert!(
        deployed.contains(&format!("{name} version 2 uploaded and active")),
        "{deployed}"
    );
    let ends = send_order(&topic, "o-11", 1).await;
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;
    assert_eq!(orders(&admin, &name).await, ["O-11", "o-10"]);
    // The first event's row was left as version 1 wrote it, and the
    // expectation written for version 1 now names the difference.
    let (out, report) = test_json(&folder, &wasm, "events.jsonl", Some("expected.json")).await;
    refused(&out, "inboxd test of version 2 against version 1's expectation");
    let differences = report["expect"]["differences"].to_string();
    assert!(differences.contains("O-1"), "{report}");
    admin.host.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_rust_handler_goes_from_an_empty_folder_to_deployed_over_https() {
    journey("rust").await;
}

#[tokio::test]
async fn a_python_handler_goes_from_an_empty_folder_to_deployed_over_https() {
    journey("python").await;
}

#[tokio::test]
async fn a_javascript_handler_goes_from_an_empty_folder_to_deployed_over_https() {
    journey("js").await;
}

/// A trap and a refused statement, in a handler that builds and checks:
/// `inboxd test` parks each with the reason a user needs.
#[tokio::test]
async fn broken_handlers_fail_test_or_check_with_the_reason() {
    let work = tempfile::tempdir().expect("tempdir");
    ok(
        &inboxd(work.path(), &["new", "rust", "broken"], &[]).await,
        "inboxd new",
    );
    let folder = work.path().join("broken");
    edit(
        &folder.join("src/lib.rs"),
        "    sql::execute(\n",
        "    if order.order_id == \"trap\" {\n        panic!(\"a bug in the handler\");\n    }\n    \
         if order.order_id == \"sneaky\" {\n        sql::execute(\"DELETE FROM inbox\", ())?;\n    }\n    sql::execute(\n",
    );
    build(&folder, "rust", "broken").await;
    let events = folder.join("broken.jsonl");
    std::fs::write(
        &events,
        [
            json!({ "event_id": new_id(), "payload": { "order_id": "trap", "amount_cents": 1 } }),
            json!({ "event_id": new_id(), "payload": { "order_id": "sneaky", "amount_cents": 1 } }),
            json!({ "event_id": new_id(), "payload": { "order_id": "fine", "amount_cents": 1 } }),
        ]
        .map(|line| line.to_string())
        .join("\n"),
    )
    .unwrap();
    let (out, report) = test_json(&folder, "target/broken.wasm", "broken.jsonl", None).await;
    ok(&out, "inboxd test without --expect");
    let records = report["records"].as_array().expect("records");
    let shown = report.to_string();
    assert_eq!(records[0]["outcome"], "parked", "{shown}");
    assert_eq!(records[0]["kind"], "retries-exhausted", "{shown}");
    assert!(
        records[0]["reason"]
            .as_str()
            .unwrap()
            .contains("a bug in the handler"),
        "the panic's message reaches the reason: {shown}"
    );
    assert_eq!(records[1]["outcome"], "parked", "{shown}");
    let sneaky = records[1]["reason"].as_str().unwrap();
    assert!(sneaky.contains("inbox"), "the refusal names the table: {sneaky}");
    assert_eq!(records[2]["outcome"], "applied", "{shown}");
    assert_eq!(
        report["tables"]["broken_orders"].as_array().map(Vec::len),
        Some(1),
        "{shown}"
    );

    // The text report says the same, one line per event.
    let text = inboxd(
        &folder,
        &[
            "test",
            "target/broken.wasm",
            "--migrations",
            "migrations",
            "--settings",
            "settings.json",
            "--events",
            "broken.jsonl",
        ],
        &[],
    )
    .await;
    let text = ok(&text, "inboxd test");
    assert!(
        text.contains("line 1: parked as retries-exhausted after 3 attempts"),
        "{text}"
    );
    assert!(text.contains("line 3: applied"), "{text}");

    // A component of another world, and a core module: refused by check.
    for (file, wat, message) in [
        (
            "other.wasm",
            "(component)",
            "does not fit the inboxd:handler world",
        ),
        (
            "core.wasm",
            "(module)",
            "is a core WebAssembly module, not a component",
        ),
    ] {
        std::fs::write(folder.join(file), wat::parse_str(wat).expect("wat")).unwrap();
        let out = inboxd(&folder, &["check", file, "--migrations", "migrations"], &[]).await;
        let text = refused(&out, &format!("inboxd check {file}"));
        assert!(text.contains(message), "{file}: {text}");
        assert_eq!(out.status.code(), Some(1), "{text}");
    }
    // A migration the walls refuse is refused by check, in the API's words.
    std::fs::write(
        folder.join("migrations/0002_peek.sql"),
        "CREATE VIEW peek AS SELECT * FROM inbox;",
    )
    .unwrap();
    let out = inboxd(
        &folder,
        &["check", "target/broken.wasm", "--migrations", "migrations"],
        &[],
    )
    .await;
    let text = refused(&out, "inboxd check with a migration that reads the inbox");
    assert!(text.contains("0002_peek.sql") && text.contains("inbox"), "{text}");
}
