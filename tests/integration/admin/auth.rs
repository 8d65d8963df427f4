//! Bearer tokens: 401 without a known one, 403 on another team's handler.

use super::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_required_and_scoped_to_their_handlers() {
    let topic = unique("admin-auth");
    create_topic(&topic, 1).await;
    let admin = start(Backend::Sqlite, &topic, "").await;
    let notifier = std::fs::read(guest_wasm("notifier")).expect("notifier.wasm");
    // A team token's handler stays in its own group namespace (inboxd.<name>.*).
    let settings = json!({ "topics": [topic], "group_id": team_group("notifier") });

    let (status, body) = admin.get("/v1/handlers", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("missing bearer token"),
        "{body}"
    );
    let (status, body) = admin.get("/v1/handlers", Some("not-a-token-at-all-1234")).await;
    assert_eq!((status, &body["error"]), (401, &json!("unknown token")));

    // The billing team cannot upload the notifier; the notify team can.
    let migrations = guest_migrations("notifier");
    let upload_as = |token| {
        admin.upload(
            "notifier",
            notifier.clone(),
            settings.clone(),
            Some(&migrations),
            token,
        )
    };
    let (status, body) = upload_as(BILLING_TOKEN).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("may not manage handler \"notifier\""),
        "{body}"
    );
    let (status, body) = upload_as(NOTIFY_TOKEN).await;
    assert_eq!(status, 201, "{body}");

    // Another team's token can neither pause, roll back, nor delete it.
    for path in ["pause", "rollback", "resume"] {
        let (status, body) = admin
            .post(&format!("/v1/handlers/notifier/{path}"), BILLING_TOKEN)
            .await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    let deleted = admin.delete("/v1/handlers/notifier", BILLING_TOKEN).await;
    assert_eq!(deleted.0, 403);
    let db = admin.env.db().await;
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM handler_deployments WHERE name = 'notifier' AND paused = 0"
        )
        .await,
        1,
        "the notifier is still deployed and running"
    );
    let (_, listed) = admin.get("/v1/handlers", Some(BILLING_TOKEN)).await;
    assert_eq!(listed, json!([]), "a team sees only its own handlers");
    let (_, listed) = admin.get("/v1/handlers", Some(OPS_TOKEN)).await;
    assert_eq!(listed[0]["name"], "notifier");

    // The owner may: roll back has nothing to go back to, delete works.
    let (status, body) = admin.post("/v1/handlers/notifier/rollback", NOTIFY_TOKEN).await;
    assert_eq!(status, 409, "{body}");
    let deleted = admin.delete("/v1/handlers/notifier", NOTIFY_TOKEN).await;
    assert_eq!(deleted.0, 200, "{}", deleted.1);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM handlers").await, 0);
    let log = admin.host.log();
    for secret in [OPS_TOKEN, BILLING_TOKEN, NOTIFY_TOKEN] {
        assert!(!log.contains(secret), "a token was logged");
    }
}
