//! Uploads whose migrations try to leave the walls (issue 13): each is
//! refused with 422 naming the file and the statement, and afterwards the
//! inbox, the offsets, the registry and the handler's rows are as they were,
//! and the events around the attempts are applied exactly once.

use super::*;
use serde_json::json;

/// Migration texts a hostile team uploads, on either backend.
const ATTACKS: &[&str] = &[
    "RESET ROLE;\nDELETE FROM inboxd.inbox;",
    "SET ROLE NONE;",
    "COMMIT;\nDELETE FROM inbox;",
    "DO $$ BEGIN DELETE FROM inboxd.inbox; END $$;",
    "SELECT set_config('role', 'postgres', true);",
    "CREATE TABLE notes (a TEXT);\nCREATE TRIGGER t AFTER INSERT ON handlers BEGIN DELETE FROM offsets; END;",
    "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN DELETE FROM inboxd.inbox; RETURN NULL; END $$;",
    "CREATE TABLE loot AS SELECT * FROM handler_deployments;",
    "DROP TABLE handler_deployments;",
    "INSERT INTO sqlite_sequence (name, seq) VALUES ('dead_letters', 0);",
    "CREATE TABLE t (a TEXT DEFAULT (set_config('role', 'postgres', true)));",
    "CREATE TEMPORARY TABLE inbox (handler TEXT);",
    "ALTER TABLE invoices OWNER TO postgres;",
    "GRANT ALL ON invoices TO PUBLIC;",
    "CREATE TABLE notes (a TEXT);\nDELETE FROM handler_tables;",
    "CREATE TABLE outbox_mine (a TEXT);",
    // Issue 23: PostgreSQL reads attribute notation as a call (ts_stat runs
    // its text as a query); the guard's parser read a field access.
    "CREATE TABLE loot AS SELECT ('SELECT to_tsvector(event_id) FROM inboxd.inbox'::text).ts_stat;",
    "CREATE TABLE notes (a TEXT DEFAULT (('SELECT 1'::text).ts_stat));",
    "CREATE INDEX i ON invoices ((order_id::regclass));",
];

crate::on_both_backends!(hostile_migrations_are_refused_and_change_nothing);

async fn hostile_migrations_are_refused_and_change_nothing(backend: Backend) {
    let topic = unique("admin-walls");
    create_topic(&topic, 1).await;
    let mut admin = start(backend, &topic, "").await;
    let billing = std::fs::read(guest_wasm("billing")).expect("billing.wasm");
    let settings = json!({
        "topics": [topic],
        "group_id": format!("inboxd.billing.{}", unique("walls")),
        "outbox_topics": { "invoices.created": unique("invoices") },
    });
    let (status, body) = admin
        .upload(
            "billing",
            billing.clone(),
            settings.clone(),
            Some(&guest_migrations("billing")),
            BILLING_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let before: Vec<Send> = (0..3).map(|i| Send::order(&new_id(), &format!("a{i}"))).collect();
    let ends = produce(&topic, &before).await;
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;
    let db = admin.env.db().await;
    let snapshot = || async {
        (
            rows(
                &db,
                "SELECT handler, event_id, status FROM inbox ORDER BY event_id",
            )
            .await,
            rows(
                &db,
                "SELECT handler, topic, partition, next_offset FROM offsets ORDER BY handler",
            )
            .await,
            rows(&db, "SELECT name, version, sha256 FROM handlers ORDER BY version").await,
            rows(
                &db,
                "SELECT name, active_version, paused FROM handler_deployments",
            )
            .await,
        )
    };
    let was = snapshot().await;

    for attack in ATTACKS {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::copy(
            guest_migrations("billing").join("0001_invoices.sql"),
            dir.path().join("0001_invoices.sql"),
        )
        .unwrap();
        std::fs::write(dir.path().join("0002_attack.sql"), attack).unwrap();
        let (status, body) = admin
            .upload(
                "billing",
                billing.clone(),
                settings.clone(),
                Some(dir.path()),
                BILLING_TOKEN,
            )
            .await;
        let error = body["error"].as_str().unwrap_or_default();
        assert_eq!(status, 422, "{attack}: {body}");
        assert!(
            error.contains("0002_attack.sql") && error.contains("refused"),
            "{attack}: the error names the file and says refused: {error}"
        );
        assert!(admin.host.is_running(), "{attack}:\n{}", admin.host.log());
    }
    assert_eq!(snapshot().await, was, "nothing changed");
    assert_eq!(
        inboxd::db::audit::planted_code(&db).await.unwrap(),
        Vec::<String>::new()
    );
    for table in ["notes", "loot", "t", "outbox_mine"] {
        assert!(
            db.query(
                &format!("SELECT * FROM {}", db.handler_table("billing", table)),
                &[]
            )
            .await
            .is_err(),
            "{table} was not created"
        );
    }

    // The events after the attempts are applied exactly once too.
    let after: Vec<Send> = (0..3).map(|i| Send::order(&new_id(), &format!("b{i}"))).collect();
    let ends = produce(&topic, &after).await;
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;
    admin.env.assert_exactly_once("invoices", 6, &ends).await;
}

crate::on_both_backends!(a_table_name_another_team_reserved_is_refused_on_sqlite);

/// Regression (issue 23): on SQLite every handler's tables share one
/// namespace, so one team could create first a name another team's
/// migrations need. `billing-team` reserves `billing_*` (see `start`):
/// another team's upload may not take such a name, billing's may. On
/// PostgreSQL each handler has its own schema and both may.
async fn a_table_name_another_team_reserved_is_refused_on_sqlite(backend: Backend) {
    let topic = unique("admin-reserved");
    create_topic(&topic, 1).await;
    let admin = start(backend, &topic, "").await;
    let with_squat = |handler: &str, file: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::copy(guest_migrations(handler).join(file), dir.path().join(file)).unwrap();
        std::fs::write(
            dir.path().join("0002_audit.sql"),
            "CREATE TABLE billing_audit (a TEXT);",
        )
        .unwrap();
        dir
    };
    let notifier = std::fs::read(guest_wasm("notifier")).expect("notifier.wasm");
    let dir = with_squat("notifier", "0001_emails.sql");
    let settings = json!({ "topics": [topic], "group_id": team_group("notifier") });
    let (status, body) = admin
        .upload("notifier", notifier, settings, Some(dir.path()), NOTIFY_TOKEN)
        .await;
    let error = body["error"].as_str().unwrap_or_default();
    match backend {
        Backend::Sqlite => {
            assert_eq!(status, 422, "{body}");
            assert!(
                error.contains("0002_audit.sql")
                    && error.contains("reserved")
                    && error.contains("billing-team"),
                "{error}"
            );
            let db = admin.env.db().await;
            assert!(
                db.query("SELECT * FROM billing_audit", &[]).await.is_err(),
                "nothing was created"
            );
        }
        Backend::Postgres => assert_eq!(status, 201, "{body}"),
    }
    let billing = std::fs::read(guest_wasm("billing")).expect("billing.wasm");
    let dir = with_squat("billing", "0001_invoices.sql");
    let settings = json!({
        "topics": [topic],
        "group_id": team_group("billing"),
        "outbox_topics": { "invoices.created": unique("invoices") },
    });
    let (status, body) = admin
        .upload("billing", billing, settings, Some(dir.path()), BILLING_TOKEN)
        .await;
    assert_eq!(status, 201, "billing's own reserved name: {body}");
}
