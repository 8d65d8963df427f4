//! Uploads that must be refused, with the reason, and change nothing.

use super::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_upload_changes_nothing_and_says_why() {
    let topic = unique("admin-bad");
    create_topic(&topic, 1).await;
    let admin = start(Backend::Sqlite, &topic, "max_component_mb = 1").await;
    let notifier = std::fs::read(guest_wasm("notifier")).expect("notifier.wasm");
    let settings = json!({ "topics": [topic], "group_id": unique("group") });
    let migrations = guest_migrations("notifier");
    let (status, body) = admin
        .upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(&migrations),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let db = admin.env.db().await;
    let table = db.handler_table("notifier", "emails");

    let component = |wat: &str| wat::parse_str(wat).expect("valid WAT");
    let cases: Vec<(&str, Vec<u8>, Value, u16, &str)> = vec![
        (
            "no export",
            component("(component)"),
            settings.clone(),
            422,
            "handle",
        ),
        (
            "forbidden import",
            component(
                r#"(component (import "wasi:http/outgoing-handler@0.2.0" (instance (export "handle" (func)))))"#,
            ),
            settings.clone(),
            422,
            "wasi:http/outgoing-handler",
        ),
        (
            "core module",
            component("(module)"),
            settings.clone(),
            422,
            "core WebAssembly module",
        ),
        (
            "too large",
            vec![0; 2 << 20],
            settings.clone(),
            413,
            "max_component_mb",
        ),
        (
            "unknown setting",
            notifier.clone(),
            json!({ "topics": [topic], "topicz": 1 }),
            422,
            "topicz",
        ),
        ("no topics", notifier.clone(), json!({}), 422, "topics"),
        // Pool slots are shared by every handler: a component that would
        // take many of them at once is refused when it is loaded.
        (
            "three memories",
            component(
                r#"(component (core module $m (memory 1))
                     (core instance (instantiate $m)) (core instance (instantiate $m))
                     (core instance (instantiate $m)))"#,
            ),
            settings.clone(),
            422,
            "3 Wasm linear memories",
        ),
        (
            // Never instantiated, yet wasmtime images each memory into the
            // compiled form: 16 MiB from 34 bytes.
            "sparse memory images",
            component(&format!(
                "(component {})",
                r#"(core module (memory 256) (data (i32.const 0) "\01") (data (i32.const 16777214) "\01"))"#
                    .repeat(2)
            )),
            settings.clone(),
            422,
            "MiB of zeros",
        ),
        (
            "33 core instances",
            component(&format!(
                "(component (core module $m) {})",
                "(core instance (instantiate $m))".repeat(33)
            )),
            settings.clone(),
            422,
            "33 core module instances",
        ),
    ];
    for (case, bytes, settings, want, says) in cases {
        let (status, body) = match admin
            .try_upload("notifier", bytes, settings, None, OPS_TOKEN)
            .await
        {
            Ok(answer) => answer,
            // The host answers 413 as soon as it has read the limit and
            // closes the connection; the client, still writing the rest,
            // may see the close (a reset) before it reads the answer. Either
            // way the upload was refused; what follows checks nothing changed.
            Err(error) if want == 413 && (error.is_request() || error.is_body()) => {
                eprintln!(
                    "{case}: the host closed the connection before the client read its answer: {error}"
                );
                continue;
            }
            Err(error) => panic!("{case}: admin API request: {error}"),
        };
        assert_eq!(status, want, "{case}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{case}: {error:?} should mention {says:?}");
    }

    // A migration that fails: the version is not stored, nothing it did stays.
    let broken = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        migrations.join("0001_emails.sql"),
        broken.path().join("0001_emails.sql"),
    )
    .unwrap();
    std::fs::write(
        broken.path().join("0002_more.sql"),
        "CREATE TABLE extra (a TEXT); CREAT TABLE nope;",
    )
    .unwrap();
    let (status, body) = admin
        .upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(broken.path()),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("0002_more"), "{body}");
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM handlers WHERE name = 'notifier'").await,
        1
    );
    assert_eq!(
        count(
            &db,
            "SELECT active_version FROM handler_deployments WHERE name = 'notifier'"
        )
        .await,
        1
    );
    assert!(
        db.query("SELECT * FROM extra", &[]).await.is_err(),
        "the failed migration's table does not exist"
    );
    // Parts past their bounds are refused as they arrive, naming the bound
    // (the fifteenth read: a 100 MiB migration file was tokenized whole).
    let long = tempfile::tempdir().expect("tempdir");
    std::fs::write(long.path().join("0001_emails.sql"), ";".repeat(3 << 19)).unwrap();
    let (status, body) = admin
        .upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(long.path()),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("longer than 1048576 bytes"),
        "{body}"
    );
    // So are names past 128 bytes and more than 1,000 files (the sixteenth
    // read: names were stored whole and read back by every version listing).
    let named = tempfile::tempdir().expect("tempdir");
    std::fs::write(named.path().join(format!("0001_{}.sql", "x".repeat(200))), "").unwrap();
    let (status, body) = admin
        .upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(named.path()),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 413, "{body}");
    assert!(body["error"].as_str().unwrap().contains("at most 128"), "{body}");
    let many = tempfile::tempdir().expect("tempdir");
    for i in 1..=1_001 {
        std::fs::write(many.path().join(format!("{i:04}_x.sql")), "").unwrap();
    }
    let (status, body) = admin
        .upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(many.path()),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("at most 1000 migration files"),
        "{body}"
    );
    // Other requests are small JSON bodies.
    let request = admin
        .http
        .post(format!("{}/v1/dead-letters/replay", admin.url))
        .header("content-type", "application/json")
        .body(format!(r#"{{"handler": "{}"}}"#, "x".repeat(100 << 10)));
    let (status, body) = admin.call(request, Some(OPS_TOKEN)).await;
    assert_eq!(status, 413, "{body}");

    // The running version still works.
    let id = new_id();
    let ends = produce(
        &topic,
        &[Send::json(
            &id,
            json!({ "order_id": "o-1", "customer_email": "a@example.com" }),
        )],
    )
    .await;
    let mut env_host = admin;
    env_host.env.handler = "notifier".into();
    env_host
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut env_host.host)
        .await;
    assert_eq!(count(&db, &format!("SELECT COUNT(*) FROM {table}")).await, 1);
}

/// A component whose compile outgrows the compile worker's CPU or memory
/// limit is refused, naming the limit's key, and the host goes on. The
/// guests here pass the static compile bound: the limits hold in a process
/// of their own, whatever that model misses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_past_its_limits_is_refused_and_the_host_goes_on() {
    let topic = unique("admin-compile");
    create_topic(&topic, 1).await;
    let settings = json!({
        "topics": [topic],
        "group_id": unique("group"),
        "outbox_topics": billing_outbox(),
    });
    let migrations = guest_migrations("billing");
    // JavaScript takes 11-14 s of CPU to compile here, Python ~0.4 GiB.
    for (wasm_toml, guest, says) in [
        (
            "compile_cpu_seconds = 1",
            "billing_js",
            "more than 1 s of CPU (wasm.compile_cpu_seconds)",
        ),
        (
            "compile_memory_mb = 256",
            "billing_py",
            "more than 256 MiB of memory",
        ),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let db_url = database_url(Backend::Sqlite, dir.path()).await;
        let mut admin = start_configured(dir, db_url, &topic, wasm_toml, "").await;
        let bytes = std::fs::read(guest_wasm(guest)).expect("guest component");
        let (status, body) = admin
            .upload("billing", bytes, settings.clone(), Some(&migrations), OPS_TOKEN)
            .await;
        assert_eq!(status, 422, "{guest} under {wasm_toml}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{guest}: {error:?} should say {says:?}");
        assert!(admin.host.is_running(), "the host died:\n{}", admin.host.log());
        let db = admin.env.db().await;
        assert_eq!(count(&db, "SELECT COUNT(*) FROM handlers").await, 0);

        // A component within the limits still compiles and is stored.
        let billing = std::fs::read(guest_wasm("billing")).expect("billing.wasm");
        let (status, body) = admin
            .upload("billing", billing, settings.clone(), Some(&migrations), OPS_TOKEN)
            .await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(count(&db, "SELECT COUNT(*) FROM handlers").await, 1);
        admin.host.kill();
    }
}
