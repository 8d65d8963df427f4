//! Per-token ceilings and allowlists, and consumer groups that no two
//! handlers share: every refusal names the key, and changes nothing.

use super::*;
use serde_json::json;

const STRICT_TOKEN: &str = "strict-secret-0123456789abcdef";

/// Handler `notifier`'s versions in `handlers`, its active version, and the
/// version the API says runs on this host.
async fn notifier_state(admin: &Admin, db: &inboxd::db::Database) -> (i64, i64, Value) {
    let versions = count(db, "SELECT COUNT(*) FROM handlers WHERE name = 'notifier'").await;
    let active = count(
        db,
        "SELECT active_version FROM handler_deployments WHERE name = 'notifier'",
    )
    .await;
    let (status, view) = admin.get("/v1/handlers/notifier", Some(OPS_TOKEN)).await;
    assert_eq!(status, 200, "{view}");
    (versions, active, view["running"]["version"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_over_a_tokens_ceilings_or_outside_its_allowlists_change_nothing() {
    let topic = unique("admin-ceilings");
    create_topic(&topic, 1).await;
    // admin.tokens[0]: a second token for the notifier, with a topic allowlist
    // and one configured ceiling; the harness's tokens follow (notify-team is [3]).
    let strict = format!(
        r#"
[[admin.tokens]]
name = "notify-strict"
token = "{STRICT_TOKEN}"
handlers = ["notifier"]
topics = ["{topic}", "notify-out.*"]
[admin.tokens.ceilings]
timeout_ms = 10000
"#
    );
    let mut admin = start(Backend::Sqlite, &topic, &strict).await;
    let notifier = std::fs::read(guest_wasm("notifier")).expect("notifier.wasm");
    let billing = std::fs::read(guest_wasm("billing")).expect("billing.wasm");
    let group = team_group("notifier");
    let settings = json!({ "topics": [topic], "group_id": group });
    let (status, body) = admin
        .upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(&guest_migrations("notifier")),
            NOTIFY_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // Another handler, by the admin token (held to nothing): a group inside
    // the notifier's namespace, and the billing's own default.
    let taken = format!("inboxd.notifier.{}", unique("taken"));
    let (status, body) = admin
        .upload(
            "billing",
            billing.clone(),
            json!({ "topics": [topic], "group_id": taken }),
            Some(&guest_migrations("billing")),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let db = admin.env.db().await;
    let before = notifier_state(&admin, &db).await;
    assert_eq!(before, (1, 1, json!("1")));

    let with = |extra: Value| {
        let mut settings = settings.clone();
        settings
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        settings
    };
    let cases: Vec<(&str, Value, &str, u16, &str)> = vec![
        (
            "timeout over the built-in team ceiling",
            with(json!({ "limits": { "timeout_ms": 600000 } })),
            NOTIFY_TOKEN,
            403,
            "settings.limits.timeout_ms = 600000 is above the ceiling 30000 of token \"notify-team\" \
             (admin.tokens[3].ceilings.timeout_ms, built in for team tokens)",
        ),
        (
            "memory over the built-in team ceiling",
            with(json!({ "limits": { "memory_mb": 4096 } })),
            NOTIFY_TOKEN,
            403,
            "settings.limits.memory_mb = 4096 is above the ceiling 512",
        ),
        (
            "batch over the built-in team ceiling",
            with(json!({ "batch": { "max_events": 10000 } })),
            NOTIFY_TOKEN,
            403,
            "settings.batch.max_events = 10000 is above the ceiling 1000",
        ),
        (
            "timeout over a configured ceiling",
            with(json!({ "limits": { "timeout_ms": 20000 } })),
            STRICT_TOKEN,
            403,
            "settings.limits.timeout_ms = 20000 is above the ceiling 10000 of token \"notify-strict\" \
             (admin.tokens[0].ceilings.timeout_ms)",
        ),
        (
            "a topic outside the allowlist",
            with(json!({ "topics": [topic, "payments"] })),
            STRICT_TOKEN,
            403,
            "settings.topics: topic \"payments\" is not allowed for token \"notify-strict\" (admin.tokens[0].topics",
        ),
        (
            "an outbox target outside the allowlist",
            with(json!({ "outbox_topics": { "mail": "payments.mail" } })),
            STRICT_TOKEN,
            403,
            "settings.outbox_topics.mail: topic \"payments.mail\" is not allowed",
        ),
        (
            "another handler's default group",
            with(json!({ "group_id": "inboxd.billing" })),
            NOTIFY_TOKEN,
            403,
            "settings.group_id = \"inboxd.billing\" is not allowed for token \"notify-team\"",
        ),
        (
            "a group outside inboxd.<name>",
            with(json!({ "group_id": unique("group") })),
            NOTIFY_TOKEN,
            403,
            "its handlers use \"inboxd.notifier\" or a group starting with \"inboxd.notifier.\"",
        ),
        (
            "a group in its namespace that another handler holds",
            with(json!({ "group_id": taken })),
            NOTIFY_TOKEN,
            409,
            "is the consumer group of uploaded handler \"billing\"",
        ),
        (
            "the admin token is held to free groups too",
            with(json!({ "group_id": taken })),
            OPS_TOKEN,
            409,
            "settings.group_id",
        ),
    ];
    for (case, settings, token, want, says) in cases {
        let (status, body) = admin
            .upload("notifier", rebuilt(&notifier, case), settings, None, token)
            .await;
        assert_eq!(status, want, "{case}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{case}: {error:?} should contain {says:?}");
        assert_eq!(
            notifier_state(&admin, &db).await,
            before,
            "{case}: no new version, the same one active and running"
        );
    }

    // Activation passes the caller's ceilings too: a version the admin
    // token uploaded above the team's ceiling is the admin's to activate.
    let generous = with(json!({ "limits": { "timeout_ms": 60000 } }));
    let (status, body) = admin
        .upload("notifier", rebuilt(&notifier, "v2"), generous, None, OPS_TOKEN)
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = admin.post("/v1/handlers/notifier/rollback", NOTIFY_TOKEN).await;
    assert_eq!(status, 200, "back to version 1, within the ceilings: {body}");
    let (status, body) = admin
        .call(
            admin
                .http
                .post(format!("{}/v1/handlers/notifier/activate", admin.url))
                .json(&json!({ "version": 2 })),
            Some(NOTIFY_TOKEN),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("settings.limits.timeout_ms = 60000 is above the ceiling 30000"),
        "{body}"
    );
    assert_eq!(notifier_state(&admin, &db).await, (2, 1, json!("1")));
    assert!(admin.host.is_running(), "{}", admin.host.log());
}
