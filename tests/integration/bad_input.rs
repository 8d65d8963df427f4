//! (c) Bad messages are parked with the right reasons, and the events after
//! them are processed: no id, a non-UUID id, a non-JSON payload.

use crate::on_both_backends;
use crate::support::*;
use inboxd::db::SqlValue;
use rdkafka::message::OwnedHeaders;
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

on_both_backends!(a_header_name_that_is_not_utf8_neither_panics_nor_loses_the_event);

/// Regression (issue 23, fifth read): rdkafka's header reader unwraps each
/// name as UTF-8, so one record whose producer named a header with other
/// bytes panicked the partition's task and shut the pump down, after every
/// restart. Now the name is read lossily and the event runs as any other:
/// one applied, one rejected with its header kept in the dead letter.
async fn a_header_name_that_is_not_utf8_neither_panics_nor_loses_the_event(backend: Backend) {
    let topic = unique("orders");
    create_topic(&topic, 1).await;
    let env = TestEnv::new(backend, "billing", &topic, "").await;
    let (applied, rejected) = (new_id(), new_id());
    let order = Send::order(&applied, "o1");
    produce_with_raw_header(&topic, &applied, &order.payload).await;
    produce_with_raw_header(&topic, &rejected, b"not json").await;
    let after = new_id();
    let ends = produce(&topic, &[Send::order(&after, "o3")]).await;

    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    assert!(host.is_running(), "a header name must not crash the host");
    let db = env.db().await;
    let invoices = env.table("invoices").await;
    let invoiced = rows(&db, &format!("SELECT event_id FROM {invoices} ORDER BY order_id")).await;
    assert_eq!(
        invoiced,
        vec![vec![SqlValue::Text(applied)], vec![SqlValue::Text(after)]]
    );
    let letters = inboxd::db::dead_letters::list(&db, "billing").await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert_eq!(letters[0].event_id.as_deref(), Some(rejected.as_str()));
    let ids = [letters[0].id];
    let filter = inboxd::db::dead_letters::Filter {
        ids: Some(&ids),
        ..Default::default()
    };
    let letter = inboxd::db::dead_letters::find(&db, &filter)
        .await
        .unwrap()
        .remove(0);
    assert!(
        letter
            .headers
            .contains(&("\u{fffd}\u{fffd}-trace".to_owned(), b"x".to_vec())),
        "{:?}",
        letter.headers
    );
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}

/// Produces one record with an `event_id` header and a header whose name is
/// the bytes `ff fe` then `-trace`: rdkafka's own API takes names as `&str`,
/// so the header is added through librdkafka's C API.
async fn produce_with_raw_header(topic: &str, event_id: &str, payload: &[u8]) {
    use rdkafka::config::ClientConfig;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let headers = OwnedHeaders::new().insert(Header {
        key: "event_id",
        value: Some(event_id.as_bytes()),
    });
    let name = b"\xff\xfe-trace";
    let raw = headers.as_borrowed() as *const _ as *mut rdkafka::bindings::rd_kafka_headers_t;
    // SAFETY: `raw` is the live, writable header list `headers` owns (its
    // borrowed view is the same pointer); librdkafka copies name and value.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_header_add(
            raw,
            name.as_ptr().cast(),
            name.len() as isize,
            b"x".as_ptr().cast(),
            1,
        )
    };
    assert_eq!(
        err,
        rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
    );
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("producer");
    producer
        .send(
            FutureRecord::to(topic).key("k").payload(payload).headers(headers),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("delivered");
}

on_both_backends!(a_compressed_record_past_the_limit_is_parked_without_being_read_whole);

/// Regression (issue 23, seventeenth read of its third round): a gzip record
/// of 64 MB of `0,` (64 KB on the wire) was copied whole, then built as a
/// JSON tree of 32 million numbers (about a gigabyte) to find its event id:
/// a few such records killed the host for memory, at every restart. Now the
/// consumer keeps the first 4 MiB of it (the larger of `max_payload_bytes`
/// and the team ceiling's default) and reads the id from that part: the event is parked as a `cut` letter that says the record's
/// size, the partition goes on, and the host's peak memory stays far below
/// the tree's.
async fn a_compressed_record_past_the_limit_is_parked_without_being_read_whole(backend: Backend) {
    const LIMIT: usize = 65_536;
    const ZEROS: usize = 32 << 20;
    let topic = unique("orders");
    create_topic(&topic, 1).await;
    let limits = format!("[handlers.limits]\nmax_payload_bytes = {LIMIT}\n");
    let env = TestEnv::new(backend, "billing", &topic, &limits).await;
    let big = new_id();
    let mut payload = format!(r#"{{"event_id":"{big}","zeros":["#).into_bytes();
    payload.reserve(ZEROS * 2);
    for _ in 0..ZEROS {
        payload.extend_from_slice(b"0,");
    }
    payload.extend_from_slice(b"0]}");
    let size = payload.len();
    produce_gzip(&topic, b"k", OwnedHeaders::new(), &payload).await;
    drop(payload);
    // A key past what the host keeps: cut too, and its key is not kept.
    let keyed = new_id();
    let small = format!(r#"{{"event_id":"{keyed}"}}"#);
    let key = vec![b'k'; 5 << 20];
    produce_gzip(&topic, &key, OwnedHeaders::new(), small.as_bytes()).await;
    let after = new_id();
    let ends = produce(&topic, &[Send::order(&after, "o2")]).await;

    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    assert!(host.is_running(), "the host survived:\n{}", host.log());
    let peak = peak_rss_bytes(host.child.id());
    eprintln!("peak RSS of the host: {} MiB", peak >> 20);
    let db = env.db().await;
    let invoices = env.table("invoices").await;
    let invoiced = rows(&db, &format!("SELECT event_id FROM {invoices}")).await;
    assert_eq!(invoiced, vec![vec![SqlValue::Text(after)]]);
    let letters = inboxd::db::dead_letters::list(&db, "billing").await.unwrap();
    assert_eq!(letters.len(), 2, "{letters:#?}");
    let ids = [letters[0].id, letters[1].id];
    let filter = inboxd::db::dead_letters::Filter {
        ids: Some(&ids),
        ..Default::default()
    };
    let found = inboxd::db::dead_letters::find(&db, &filter).await.unwrap();
    let letter = &found[0];
    assert_eq!(
        letter.event_id.as_deref(),
        Some(big.as_str()),
        "the id, read from the part kept"
    );
    assert_eq!(
        letter.payload.len(),
        4 << 20,
        "the part kept: the team ceiling's default"
    );
    assert_eq!(letter.kind, "cut");
    assert_eq!(
        letter.record_bytes,
        Some(size as i64 + 1),
        "payload and key: {}",
        letter.reason
    );
    assert!(letter.reason.contains("cannot be replayed"), "{}", letter.reason);
    let by_key = &found[1];
    assert_eq!(by_key.event_id.as_deref(), Some(keyed.as_str()));
    assert_eq!(by_key.kind, "cut");
    assert_eq!(by_key.key, None, "a key past what the host keeps is not kept");
    assert_eq!(by_key.record_bytes, Some((key.len() + small.len()) as i64));
    assert!(
        by_key.reason.contains("the key is 5242880 bytes"),
        "{}",
        by_key.reason
    );
    // The tree alone was 32 bytes a number: a gigabyte. What is left is
    // librdkafka's decompressed copy and the host's own.
    assert!(
        peak < 512 << 20,
        "peak RSS {} MiB for a {} MiB record",
        peak >> 20,
        size >> 20
    );
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}

/// The peak resident memory of process `pid` (`VmHWM`), in bytes.
fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib * 1024
}

on_both_backends!(a_record_whose_headers_cannot_be_read_is_parked_not_run);

/// Regression (issue 23, twenty-first read of its third round): librdkafka
/// reads no headers of a record with more than 100,000 (or malformed ones),
/// and the host ran such a record as if it had none: its id from the JSON
/// where every other client reads the header, its business key header gone.
/// Now it is cut (`cut` letter) and never run.
async fn a_record_whose_headers_cannot_be_read_is_parked_not_run(backend: Backend) {
    use rdkafka::message::Header;
    let topic = unique("orders");
    create_topic(&topic, 1).await;
    let env = TestEnv::new(backend, "billing", &topic, "").await;
    let unreadable = new_id();
    let mut headers = OwnedHeaders::new_with_capacity(100_002).insert(Header {
        key: "event_id",
        value: Some(unreadable.as_bytes()),
    });
    for _ in 0..100_001 {
        headers = headers.insert(Header {
            key: "h",
            value: Some(b"x"),
        });
    }
    let order = Send::order(&unreadable, "o1");
    produce_gzip(&topic, b"o1", headers, &order.payload).await;
    let after = new_id();
    let ends = produce(&topic, &[Send::order(&after, "o2")]).await;

    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    assert!(host.is_running(), "the host survived:\n{}", host.log());
    let db = env.db().await;
    let invoices = env.table("invoices").await;
    let invoiced = rows(&db, &format!("SELECT event_id FROM {invoices}")).await;
    assert_eq!(
        invoiced,
        vec![vec![SqlValue::Text(after)]],
        "the unreadable one never ran"
    );
    let letters = inboxd::db::dead_letters::list(&db, "billing").await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert_eq!(letters[0].kind, "cut");
    assert!(
        letters[0].reason.contains("headers could not be read"),
        "{}",
        letters[0].reason
    );
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
}
