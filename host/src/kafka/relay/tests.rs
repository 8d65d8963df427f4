//! The relay against librdkafka's mock cluster: parking, byte budgets, missing topics.

use super::*;
use crate::db::outbox::{NewMessage, ParkedFilter};
use crate::db::test_support::sqlite_db;
use rdkafka::mocking::MockCluster;

/// An idempotent producer to `cluster` that refuses messages over `max_bytes`.
fn mock_producer(
    cluster: &MockCluster<'_, rdkafka::producer::DefaultProducerContext>,
    max_bytes: &str,
) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("enable.idempotence", "true")
        .set("message.max.bytes", max_bytes)
        .set("message.timeout.ms", "10000")
        .create()
        .unwrap()
}

fn message(topic: &str, key: &str, payload: Vec<u8>) -> NewMessage {
    NewMessage {
        id: uuid::Uuid::now_v7().to_string(),
        topic: topic.into(),
        key: Some(key.as_bytes().to_vec()),
        payload,
        headers: vec![],
    }
}

#[test]
fn topic_names_kafka_refuses_are_known_before_sending() {
    for good in ["orders", "prod.invoices-created_v2", &"a".repeat(249)] {
        assert_eq!(invalid_topic(good), None, "{good}");
    }
    for bad in ["", ".", "..", "bad topic!", "é", "a/b", &"a".repeat(250)] {
        let reason = invalid_topic(bad).expect(bad);
        assert!(reason.contains("outbox_topics"), "{reason}");
    }
    let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
    assert!(permanent(&too_large));
    let away = KafkaError::MessageProduction(RDKafkaErrorCode::AllBrokersDown);
    assert!(!permanent(&away));
    let timed_out = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
    assert!(!permanent(&timed_out));
}

/// Regression: a message the broker never accepts (an invalid topic, too
/// large) was retried forever and held back its bucket and the relay.
#[tokio::test]
async fn undeliverable_messages_are_parked_and_the_rest_is_relayed() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("good", 1, 1).unwrap();
    let producer = mock_producer(&cluster, "2000");
    let db = sqlite_db().await;
    // One key, so one bucket: the bad ones come first in it.
    let invalid = message("bad topic!", "k", b"{}".to_vec());
    let huge = message("good", "k", vec![b'x'; 5_000]);
    let after = message("good", "k", b"after".to_vec());
    let elsewhere = message("good", "other-key", b"elsewhere".to_vec());
    let mut tx = db.begin().await.unwrap();
    outbox::insert(
        &mut tx,
        "h",
        &[invalid.clone(), huge.clone(), after.clone(), elsewhere.clone()],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let mut relay = Relay::new(db.clone(), producer, "host-1".into(), Settle::Keep);
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    while outbox::backlog(&db, "h").await.unwrap().0 > 0 || !relay.busy.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the relay did not settle"
        );
        relay.step(&shutdown).await.unwrap();
    }
    let parked = outbox::parked(&db, &ParkedFilter::default()).await.unwrap();
    let reasons: HashMap<&str, &str> = parked
        .iter()
        .map(|p| (p.id.as_str(), p.reason.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(reasons.len(), 2, "{parked:#?}");
    assert!(
        reasons[invalid.id.as_str()].contains("not a valid Kafka topic name"),
        "{reasons:?}"
    );
    assert!(
        reasons[huge.id.as_str()].to_lowercase().contains("too large"),
        "{reasons:?}"
    );
    let published = db
        .query(
            "SELECT id FROM outbox WHERE published_at IS NOT NULL ORDER BY seq",
            &[],
        )
        .await
        .unwrap();
    let published: Vec<&str> = published.iter().map(|r| r[0].as_str().unwrap()).collect();
    assert_eq!(published, [after.id.as_str(), elsewhere.id.as_str()]);
}

/// Regression (the sixth read of this round, issue 23): a message to a
/// topic nobody created failed for a passing reason for good, and held
/// back every other handler's messages in its bucket. Now it is parked
/// (here at once: no wait is configured), later messages to that topic
/// are parked without a try, and the other handler's message goes.
#[tokio::test]
async fn a_missing_topic_is_parked_and_its_bucket_goes_on() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("good", 1, 1).unwrap();
    let producer = mock_producer(&cluster, "2000");
    let db = sqlite_db().await;
    let shared = outbox::bucket("h", Some(b"k"));
    let their_key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| outbox::bucket("other", Some(k.as_bytes())) == shared)
        .unwrap();
    let first = message("nowhere", "k", b"1".to_vec());
    let again = message("nowhere", "k", b"2".to_vec());
    let theirs = message("good", &their_key, b"theirs".to_vec());
    let mut tx = db.begin().await.unwrap();
    outbox::insert(&mut tx, "h", &[first.clone(), again.clone()])
        .await
        .unwrap();
    outbox::insert(&mut tx, "other", std::slice::from_ref(&theirs))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let seq = |id: String| {
        let db = db.clone();
        async move {
            let rows = db
                .query("SELECT seq FROM outbox WHERE id = $1", &[id.into()])
                .await
                .unwrap();
            rows[0][0].as_i64().unwrap()
        }
    };

    let mut relay = Relay::new(db.clone(), producer, "host-1".into(), Settle::Keep);
    relay.missing = MissingTopics::new(Duration::ZERO);
    // The mock cluster creates any topic asked for, so the broker's
    // answer for the first message is the one thing made up here.
    let refused = Outcome {
        failed: Some((
            seq(first.id.clone()).await,
            "Broker: Unknown topic or partition".into(),
        )),
        missing_topic: Some(("h".into(), "nowhere".into())),
        ..Outcome::default()
    };
    relay.settle(vec![(shared, refused)]).await.unwrap();

    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let parked = loop {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the bucket did not go on"
        );
        relay.step(&shutdown).await.unwrap();
        let parked = outbox::parked(&db, &ParkedFilter::default()).await.unwrap();
        let sent = db
            .query(
                "SELECT 1 FROM outbox WHERE id = $1 AND published_at IS NOT NULL",
                &[theirs.id.clone().into()],
            )
            .await
            .unwrap();
        if parked.len() == 2 && !sent.is_empty() && relay.busy.is_empty() {
            break parked;
        }
    };
    // The second was never tried (the mock would have created the topic
    // and taken it): its reason is the quarantine's.
    for (message, why) in [(&first, "Unknown topic"), (&again, "was parked for this")] {
        let reason = parked
            .iter()
            .find(|p| p.id == message.id)
            .unwrap()
            .reason
            .clone()
            .unwrap();
        assert!(
            reason.contains("\"nowhere\" does not exist") && reason.contains(why),
            "{reason}"
        );
    }
}

/// Regression (issue 23, third read): a look read 200 messages of each
/// of 64 buckets whatever their size (12.8 GB of one-megabyte messages).
/// Now what the relay holds in flight stays within [`HELD_BYTES`], and
/// the backlog still drains.
#[tokio::test]
async fn the_relay_holds_at_most_its_byte_budget_and_drains() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("good", 1, 1).unwrap();
    let producer = mock_producer(&cluster, "4000000");
    let db = sqlite_db().await;
    // 48 keys (about as many buckets) of two 1.5 MiB messages each: 144 MiB.
    let size = 3 * 1024 * 1024 / 2;
    let messages: Vec<NewMessage> = (0..96)
        .map(|i| message("good", &format!("key-{}", i % 48), vec![b'x'; size]))
        .collect();
    for chunk in messages.chunks(8) {
        let mut tx = db.begin().await.unwrap();
        outbox::insert(&mut tx, "h", chunk).await.unwrap();
        tx.commit().await.unwrap();
    }
    let mut relay = Relay::new(db.clone(), producer, "host-1".into(), Settle::Delete);
    relay.start_ready().await.unwrap();
    let held: u64 = relay.busy.values().sum();
    assert!(
        held <= HELD_BYTES && held > HELD_BYTES - 2 * size as u64,
        "a look took {held} bytes; the budget is {HELD_BYTES}"
    );
    relay.start_ready().await.unwrap();
    assert_eq!(relay.busy.values().sum::<u64>(), held, "nothing more while full");

    let shutdown = CancellationToken::new();
    let started = Instant::now();
    while outbox::backlog(&db, "h").await.unwrap().0 > 0 || !relay.busy.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the relay did not drain"
        );
        relay.step(&shutdown).await.unwrap();
        let held: u64 = relay.busy.values().sum();
        assert!(held <= HELD_BYTES, "{held} bytes in flight");
    }
}
