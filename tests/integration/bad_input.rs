//! (c) Bad messages are parked with the right reasons, and the events after
//! them are processed: no id, a non-UUID id, a non-JSON payload.

use crate::on_both_backends;
use crate::support::*;
use inboxd::db::SqlValue;
use std::time::Duration;

on_both_backends!(bad_messages_are_dead_lettered_with_reasons_and_the_partition_moves_on);

async fn bad_messages_are_dead_lettered_with_reasons_and_the_partition_moves_on(backend: Backend) {
    let topic = unique("orders");
    create_topic(&topic, 1).await;
    let env = TestEnv::new(backend, "billing", &topic, "").await;

    let good_before = new_id();
    let good_after = new_id();
    let valid_id_bad_payload = new_id();
    let records = vec![
        Send::order(&good_before, "o1"),
        // No header and no event_id field.
        Send {
            key: "k".into(),
            event_id_header: None,
            payload: br#"{"order_id":"o2"}"#.to_vec(),
            traceparent: None,
        },
        // An id that is not a UUID.
        Send {
            key: "k".into(),
            event_id_header: Some("order-3".into()),
            payload: br#"{"order_id":"o3"}"#.to_vec(),
            traceparent: None,
        },
        // Not JSON, no header: no id can be read at all.
        Send {
            key: "k".into(),
            event_id_header: None,
            payload: b"\x00\x01 not json".to_vec(),
            traceparent: None,
        },
        // A valid id but a payload the billing handler rejects.
        Send {
            key: "k".into(),
            event_id_header: Some(valid_id_bad_payload.clone()),
            payload: b"not json".to_vec(),
            traceparent: None,
        },
        Send::order(&good_after, "o6"),
    ];
    let ends = produce(&topic, &records).await;

    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    assert!(host.is_running(), "bad input must not crash the host");

    let db = env.db().await;
    let invoices = env.table("invoices").await;
    let invoiced = rows(&db, &format!("SELECT event_id FROM {invoices} ORDER BY order_id")).await;
    assert_eq!(
        invoiced,
        vec![
            vec![SqlValue::Text(good_before)],
            vec![SqlValue::Text(good_after)]
        ]
    );

    let letters = inboxd::db::dead_letters::list(&db, "billing").await.unwrap();
    let summary: Vec<(i64, &str, &str)> = letters
        .iter()
        .map(|l| (l.offset, l.kind.as_str(), l.reason.as_str()))
        .collect();
    assert_eq!(summary.len(), 4, "{summary:#?}");
    assert_eq!(summary[0].0, 1);
    assert_eq!(summary[0].1, "event-id");
    assert!(
        summary[0]
            .2
            .contains("no header \"event_id\" and the payload has no JSON field \"event_id\""),
        "{summary:#?}"
    );
    assert_eq!((summary[1].0, summary[1].1), (2, "event-id"));
    assert!(
        summary[1].2.contains("\"order-3\"") && summary[1].2.contains("is not a UUID"),
        "{summary:#?}"
    );
    assert_eq!((summary[2].0, summary[2].1), (3, "event-id"));
    assert!(summary[2].2.contains("not JSON"), "{summary:#?}");
    assert_eq!((summary[3].0, summary[3].1), (4, "rejected"));
    assert!(
        summary[3].2.contains("not valid JSON for OrderConfirmed"),
        "{summary:#?}"
    );
    assert_eq!(
        letters[3].event_id.as_deref(),
        Some(valid_id_bad_payload.as_str())
    );

    // The rejected event's inbox row says dead, so a replayed copy is not run again.
    let status = rows(
        &db,
        &format!("SELECT status FROM inbox WHERE event_id = '{valid_id_bad_payload}'"),
    )
    .await;
    assert_eq!(status, vec![vec![SqlValue::Text("dead".into())]]);
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}
