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

crate::on_both_backends!(a_row_bound_sqlite_cannot_keep_is_refused_before_anything_is_stored);

/// Regression (issue 23, the forty-fourth read): on SQLite a version whose
/// `limits.max_row_bytes` is over 1 MiB was stored and its migrations run,
/// and only its load refused it. The upload's settings check refuses it
/// now: 422 naming the setting, no version and no table. PostgreSQL takes it.
async fn a_row_bound_sqlite_cannot_keep_is_refused_before_anything_is_stored(backend: Backend) {
    let topic = unique("admin-row-bound");
    create_topic(&topic, 1).await;
    let admin = start(backend, &topic, "").await;
    let settings = json!({
        "topics": [topic],
        "group_id": team_group("billing"),
        "outbox_topics": { "invoices.created": unique("invoices") },
        "limits": { "max_row_bytes": 2 << 20 },
    });
    let (status, body) = admin.upload_guest("billing", settings, BILLING_TOKEN).await;
    let db = admin.env.db().await;
    let versions = rows(&db, "SELECT name, version FROM handlers").await;
    match backend {
        Backend::Sqlite => {
            let error = body["error"].as_str().unwrap_or_default();
            assert_eq!(status, 422, "{body}");
            assert!(
                error.contains("limits.max_row_bytes") && error.contains("SQLite"),
                "the error names the setting: {error}"
            );
            assert!(versions.is_empty(), "no version was stored: {versions:?}");
            assert!(
                db.query("SELECT * FROM invoices", &[]).await.is_err(),
                "no migration ran"
            );
        }
        Backend::Postgres => {
            assert_eq!(status, 201, "{body}");
            assert_eq!(versions.len(), 1, "{versions:?}");
        }
    }
}

crate::on_both_backends!(a_handler_the_instance_pool_cannot_hold_is_refused);

/// Regression (issue 23, the forty-fourth read): the host's Wasm instances
/// must hold every handler's calls at once, or a hostile handler's calls
/// could hold the instances others wait for. On PostgreSQL each handler
/// runs up to `database.max_connections` (8) calls, so a pool of 8 holds
/// one handler: a second is refused with 422 naming `wasm.instances`, and
/// nothing of it is stored, while a new version of the first takes its old
/// one's share. SQLite runs one call at a time and takes both.
async fn a_handler_the_instance_pool_cannot_hold_is_refused(backend: Backend) {
    let topic = unique("admin-pool");
    create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let db_url = database_url(backend, dir.path()).await;
    let mut admin = start_configured(dir, db_url, &topic, "instances = 8", "").await;
    let settings = json!({
        "topics": [topic],
        "group_id": team_group("billing"),
        "outbox_topics": { "invoices.created": unique("invoices") },
    });
    for _ in 0..2 {
        let (status, body) = admin
            .upload_guest("billing", settings.clone(), BILLING_TOKEN)
            .await;
        assert_eq!(status, 201, "billing, and a new version of it: {body}");
    }
    let settings = json!({ "topics": [topic], "group_id": team_group("notifier") });
    let (status, body) = admin.upload_guest("notifier", settings, NOTIFY_TOKEN).await;
    let db = admin.env.db().await;
    let notifiers = rows(&db, "SELECT version FROM handlers WHERE name = 'notifier'").await;
    match backend {
        Backend::Postgres => {
            let error = body["error"].as_str().unwrap_or_default();
            assert_eq!(status, 422, "{body}");
            assert!(
                error.contains("wasm.instances") && error.contains("need 16 Wasm instances"),
                "the error names the setting and the need: {error}"
            );
            assert!(notifiers.is_empty(), "nothing stored: {notifiers:?}");
        }
        Backend::Sqlite => assert_eq!(status, 201, "{body}"),
    }
    assert!(admin.host.is_running(), "{}", admin.host.log());
}
