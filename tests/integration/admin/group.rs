//! An upload through one host reaches every host of the consumer group.

use super::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_reaches_every_host_of_the_group() {
    let topic = unique("admin-group");
    create_topic(&topic, 4).await;
    let mut admin = start(Backend::Postgres, &topic, "").await;
    let mut follower = spawn_follower(&admin);
    let billing = std::fs::read(guest_wasm("billing")).expect("billing.wasm");
    let settings =
        json!({ "topics": [topic], "group_id": unique("group"), "outbox_topics": billing_outbox() });
    let (status, body) = admin
        .upload(
            "billing",
            billing.clone(),
            settings.clone(),
            Some(&guest_migrations("billing")),
            OPS_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let loaded = poll_until(Duration::from_secs(30), || {
        let seen = logged(&follower, "handler loaded", &[("handler", json!("billing"))]);
        async move { seen }
    })
    .await;
    assert!(
        loaded,
        "the other host never loaded the upload:\n{}",
        follower.log()
    );

    let records = orders_with_duplicates(400, 5);
    let ends = produce(&topic, &records).await;
    let shared = poll_until(Duration::from_secs(60), || {
        let assigned = follower.log().lines().any(|l| {
            serde_json::from_str::<Value>(l).is_ok_and(|line| {
                line["fields"]["message"] == "partitions assigned"
                    && line["fields"]["partitions"].as_str().is_some_and(|p| p != "[]")
            })
        });
        async move { assigned }
    })
    .await;
    assert!(shared, "the other host never got partitions:\n{}", follower.log());
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;

    // Version 2 through one host: the other follows.
    let (status, body) = admin
        .upload("billing", rebuilt(&billing, "v2"), settings, None, OPS_TOKEN)
        .await;
    assert_eq!(status, 201, "{body}");
    let swapped = poll_until(Duration::from_secs(30), || {
        let seen = logged(&follower, "handler version activated", &[("to", json!(2))]);
        async move { seen }
    })
    .await;
    assert!(swapped, "the other host never switched:\n{}", follower.log());
    let more = orders_with_duplicates(200, 5);
    let mut all_ends = ends.clone();
    for (partition, end) in produce(&topic, &more).await {
        all_ends.insert(partition, end);
    }
    admin
        .env
        .wait_for_offsets(&all_ends, Duration::from_secs(120), &mut admin.host)
        .await;
    admin.env.assert_exactly_once("invoices", 600, &all_ends).await;
    let db = admin.env.db().await;
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM inbox WHERE handler = 'billing' AND handler_version = '2'"
        )
        .await,
        200,
        "every order sent after both hosts switched ran on version 2"
    );
    assert!(follower.is_running() && admin.host.is_running());
    assert_eq!(follower.terminate(Duration::from_secs(30)).await, Some(0));
    assert_eq!(admin.host.terminate(Duration::from_secs(30)).await, Some(0));
}
