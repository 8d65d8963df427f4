//! Responses hold their request's place until they are sent: a team token
//! whose clients read nothing runs out of its own places, not the host of
//! memory, and another team is not held up.

use super::*;
use rdkafka::message::{Header, OwnedHeaders};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A team token has 8 places (`admin/responses.rs`).
const TEAM_PLACES: usize = 8;

/// Regression (issue 23, nineteenth read): a response is built whole, and
/// hyper took it in one frame and dropped the body, with its place, before a
/// byte was sent. A team opening connection after connection, reading none
/// of a dead letter's 30 MB detail, held all of them in the host's memory.
/// Now the body goes to hyper in pieces and keeps its place until the last:
/// eight unread details take the team's eight places, its ninth request is
/// refused (503), another team's is served, and closing the connections
/// gives the places back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_responses_hold_their_teams_places_and_no_one_elses() {
    let topic = unique("places");
    create_topic(&topic, 1).await;
    let mut admin = start(Backend::Sqlite, &topic, "").await;
    let billing = std::fs::read(guest_wasm("billing")).expect("billing.wasm");
    let settings = json!({
        "topics": [topic],
        "group_id": team_group("billing"),
        "outbox_topics": billing_outbox(),
        "limits": { "max_payload_bytes": 65_536 },
    });
    let (status, body) = admin
        .upload(
            "billing",
            billing,
            settings,
            Some(&guest_migrations("billing")),
            BILLING_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // Past the handler's limit and kept whole (under 4 MiB): a `limit`
    // letter whose detail escapes each control byte six times.
    let id = new_id();
    let headers = OwnedHeaders::new().insert(Header {
        key: "event_id",
        value: Some(id.as_bytes()),
    });
    produce_gzip(&topic, b"k", headers, &vec![1u8; (4 << 20) - 1024]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let id = loop {
        let (_, listed) = admin.get("/v1/dead-letters", Some(BILLING_TOKEN)).await;
        if let Some(id) = listed[0]["id"].as_i64() {
            break id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the record was never parked:\n{}",
            admin.host.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let address = admin.url.trim_start_matches("http://").to_owned();
    let mut unread = Vec::new();
    for _ in 0..TEAM_PLACES {
        let mut connection = TcpStream::connect(&address).await.expect("connect");
        let request = format!(
            "GET /v1/dead-letters/{id} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {BILLING_TOKEN}\r\n\r\n"
        );
        connection.write_all(request.as_bytes()).await.expect("request");
        unread.push(connection);
    }
    // The team's places are taken until those are read: its next request waits, then 503.
    let full = poll_until(Duration::from_secs(60), || async {
        admin.get("/v1/handlers", Some(BILLING_TOKEN)).await.0 == 503
    })
    .await;
    assert!(full, "unread responses gave their places back");
    let (status, body) = admin.get("/v1/handlers", Some(NOTIFY_TOKEN)).await;
    assert_eq!(status, 200, "another team has places of its own: {body}");
    drop(unread);
    let freed = poll_until(Duration::from_secs(30), || async {
        admin.get("/v1/handlers", Some(BILLING_TOKEN)).await.0 == 200
    })
    .await;
    assert!(freed, "closed connections gave their places back");
    assert!(
        admin.host.is_running(),
        "the host is still up:\n{}",
        admin.host.log()
    );
}
