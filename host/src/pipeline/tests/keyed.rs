//! Batches with key order (`Fence::Keyed`): they never write the offset,
//! give back what follows a retry, never run a record behind a parked one of
//! its key (parked in this batch, or by another consumer meanwhile), and a
//! parked record's key is reported so its later records are held.

use super::harness::{Harness, id, record};
use super::scripted::Act;
use crate::db::dead_letters::{self, DeadLetter, ReasonKind};
use crate::db::now_ms;
use crate::db::test_support::each_backend;
use crate::handler::GuestFailure;
use crate::pipeline::{BatchCursor, BatchEnd, Fence};
use crate::record::Record;

/// Event `n` at `offset` with Kafka key `key`.
fn keyed(offset: i64, n: u32, key: &str) -> Record {
    let mut record = record(offset, &id(n));
    record.key = Some(key.as_bytes().to_vec());
    record
}

async fn keyed_batch(h: &Harness, records: &[Record]) -> (BatchEnd, BatchCursor) {
    let mut cursor = BatchCursor::keyed();
    let end = h
        .pipeline
        .process_batch(records, &mut cursor, &h.shutdown)
        .await
        .unwrap();
    (end, cursor)
}

fn applied(effects: Vec<(String, i64)>) -> Vec<String> {
    effects.into_iter().map(|(e, _)| e).collect()
}

#[tokio::test]
async fn a_parked_record_ends_the_batch_before_a_later_record_of_its_key() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        h.handler
            .on(&id(2), vec![Act::Fail(GuestFailure::Reject("no".into()))]);
        let batch = [
            keyed(0, 1, "b"),
            keyed(1, 2, "a"),
            keyed(2, 3, "c"),
            keyed(3, 4, "a"),
        ];
        let (end, cursor) = keyed_batch(&h, &batch).await;
        assert_eq!(end, BatchEnd::Returned(None), "{on:?}");
        assert_eq!(cursor.done, 2, "{on:?}: up to and with the parked one");
        assert_eq!(cursor.parked_keys, vec![b"a".to_vec()], "{on:?}");
        assert_eq!(
            applied(h.effects().await),
            [id(1)],
            "{on:?}: 3 and 4 came back unrun"
        );
        assert_eq!(h.status(&id(3)).await, None, "{on:?}: its claim went back");
        assert_eq!(
            h.offset().await,
            None,
            "{on:?}: a keyed batch never writes the offset"
        );
    }
}

#[tokio::test]
async fn a_retry_gives_the_rest_back_instead_of_waiting() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        let retry = GuestFailure::Retry("busy".into());
        h.handler.on_attempt(&id(2), 1, vec![Act::Fail(retry)]);
        let batch = [keyed(0, 1, "a"), keyed(1, 2, "b"), keyed(2, 3, "c")];
        let (end, cursor) = keyed_batch(&h, &batch).await;
        let BatchEnd::Returned(Some(deferred)) = end else {
            panic!("{on:?}: {end:?}");
        };
        assert_eq!((deferred.attempt, cursor.done), (2, 1), "{on:?}");
        assert_eq!(applied(h.effects().await), [id(1)], "{on:?}");
        // Its next attempt runs alone, when the task says.
        let outcome = h
            .pipeline
            .process_alone(
                &batch[1],
                Fence::Keyed,
                &h.shutdown,
                2,
                Some(deferred.first_failed_at),
            )
            .await
            .unwrap();
        assert_eq!(outcome, crate::pipeline::Outcome::Applied, "{on:?}");
        assert_eq!(applied(h.effects().await), [id(1), id(2)], "{on:?}");
        assert_eq!(h.offset().await, None, "{on:?}");
    }
}

#[tokio::test]
async fn a_key_another_consumer_parked_meanwhile_is_not_run() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        // Another consumer parked key a's record at offset 0 (a rebalance):
        // this task never saw it, and its batch has a's next record.
        let parked = keyed(0, 1, "a");
        let mut tx = h.pipeline.db().begin_write().await.unwrap();
        dead_letters::insert(
            &mut tx,
            &DeadLetter {
                handler: super::harness::HANDLER,
                event_id: Some(&id(1)),
                topic: &parked.topic,
                partition: parked.partition,
                offset: 0,
                key: parked.key.as_deref(),
                payload: &parked.payload,
                headers: &parked.headers,
                kind: ReasonKind::Rejected,
                reason: "no",
                attempts: 1,
                handler_version: None,
                first_failed_at: now_ms(),
                record_bytes: None,
            },
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        let batch = [keyed(1, 2, "b"), keyed(2, 3, "a"), keyed(3, 4, "c")];
        let (end, cursor) = keyed_batch(&h, &batch).await;
        assert_eq!(end, BatchEnd::Returned(None), "{on:?}");
        assert_eq!(
            (cursor.done, cursor.parked_keys.clone()),
            (1, vec![b"a".to_vec()]),
            "{on:?}"
        );
        assert_eq!(applied(h.effects().await), [id(2)], "{on:?}");
        // Held behind it, then released by its replay: see `Pipeline::hold`.
        let held = h.pipeline.hold(b"a", &batch[1..2], 10).await.unwrap();
        assert!(
            matches!(held, crate::pipeline::Held::Parked { count: 1, .. }),
            "{on:?}: {held:?}"
        );
        let kinds: Vec<ReasonKind> = h.dead_letters().await.iter().map(|l| l.kind).collect();
        assert_eq!(kinds, [ReasonKind::Rejected, ReasonKind::Held], "{on:?}");
        // At its bound, nothing more is held.
        let full = h.pipeline.hold(b"a", &[keyed(5, 6, "a")], 1).await.unwrap();
        assert!(
            matches!(full, crate::pipeline::Held::Full { held: 1 }),
            "{on:?}: {full:?}"
        );
    }
}

#[tokio::test]
async fn a_record_behind_one_parked_in_the_one_at_a_time_runs_is_not_run() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        // 1 breaks the walls: the batch runs its records one at a time, and
        // 1 is parked there; 3, of its key, must come back unrun.
        h.handler.on(&id(1), vec![Act::Effect, Act::BreakInbox]);
        let batch = [keyed(0, 1, "a"), keyed(1, 2, "b"), keyed(2, 3, "a")];
        let (end, cursor) = keyed_batch(&h, &batch).await;
        assert_eq!(end, BatchEnd::Returned(None), "{on:?}");
        assert!(cursor.parked_keys.contains(&b"a".to_vec()), "{on:?}: {cursor:?}");
        assert!(!applied(h.effects().await).contains(&id(3)), "{on:?}");
        assert_eq!(h.status(&id(3)).await, None, "{on:?}");
    }
}
