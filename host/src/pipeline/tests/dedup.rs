//! Business-key dedup (`[handlers.dedup]`) in the pipeline's batches: an
//! event whose key another applied event holds is not run; a parked or
//! retried event holds no key; copies in one batch and across batches.

use super::harness::{Harness, id, record};
use super::scripted::Act;
use crate::config::DedupConfig;
use crate::db::test_support::each_backend;
use crate::handler::GuestFailure;
use crate::pipeline::{BatchEnd, Outcome};
use crate::record::Record;
use std::time::Duration;

/// Event `n` at `offset` whose business key is the header `order`.
fn order(offset: i64, n: u32, order: &str) -> Record {
    let mut record = record(offset, &id(n));
    record
        .headers
        .push(("order".to_owned(), order.as_bytes().to_vec()));
    record
}

fn by_order_header(window: Duration) -> Option<DedupConfig> {
    Some(DedupConfig {
        key: None,
        header: Some("order".into()),
        window,
    })
}

#[tokio::test]
async fn an_event_whose_business_key_was_applied_is_not_run_and_a_failed_one_holds_none() {
    for db in each_backend().await {
        let h = Harness::with_dedup(db, by_order_header(Duration::from_secs(3600))).await;
        let on = h.backend();
        h.handler
            .on(&id(3), vec![Act::Fail(GuestFailure::Reject("no".into()))]);
        let retry = GuestFailure::Retry("busy".into());
        h.handler
            .on_attempt(&id(5), 1, vec![Act::Effect, Act::Fail(retry)]);
        let batch = [
            order(0, 1, "A"),
            order(1, 2, "A"),  // A again under a new id, in the same batch
            order(2, 3, "B"),  // rejected: parked, holds no key
            order(3, 4, "B"),  // so B applies here
            order(4, 5, "C"),  // retried once, its key released meanwhile
            order(5, 6, "C"),  // C is 5's once it applied
            record(6, &id(7)), // no key: its event id alone
            order(7, 8, "E"),  // claimed with the batch; 5's retry must free it
        ];
        let (end, _) = h.batch(&batch).await;
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        let applied: Vec<String> = h.effects().await.into_iter().map(|(e, _)| e).collect();
        assert_eq!(applied, [id(1), id(4), id(5), id(7), id(8)], "{on:?}");
        assert!(
            !h.handler
                .call_order()
                .iter()
                .any(|(e, _)| *e == id(2) || *e == id(6)),
            "{on:?}: a duplicate by key is never run"
        );
        for n in [2, 6] {
            assert_eq!(h.status(&id(n)).await.as_deref(), Some("done"), "{on:?}: claimed");
        }
        let parked: Vec<_> = h.dead_letters().await.into_iter().map(|p| p.offset).collect();
        assert_eq!(parked, [2], "{on:?}");
        assert_eq!(h.offset().await, Some(8), "{on:?}");
        let stats = h.pipeline.stats().snapshot();
        assert_eq!(
            stats.duplicates, 2,
            "{on:?}: duplicates by key count as duplicates"
        );
        assert_eq!(h.pipeline.stats().duplicates_by_key_total(), 2, "{on:?}");

        // A later batch and a lone event meet the held keys too.
        let (end, _) = h.batch(&[order(8, 9, "A"), order(9, 10, "D")]).await;
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        assert_eq!(h.single(&order(10, 11, "D")).await, Outcome::Duplicate, "{on:?}");
        let applied: Vec<String> = h.effects().await.into_iter().map(|(e, _)| e).collect();
        assert_eq!(applied, [id(1), id(4), id(5), id(7), id(8), id(10)], "{on:?}");
    }
}

#[tokio::test]
async fn a_key_whose_window_has_passed_is_taken_by_the_next_event() {
    for db in each_backend().await {
        let h = Harness::with_dedup(db, by_order_header(Duration::ZERO)).await;
        let on = h.backend();
        // Within one batch the first event of a key holds it.
        let (end, _) = h.batch(&[order(0, 1, "A"), order(1, 2, "A")]).await;
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        // In the next, its window (of 0) has passed: the key is taken anew.
        let (end, _) = h.batch(&[order(2, 3, "A")]).await;
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        let applied: Vec<String> = h.effects().await.into_iter().map(|(e, _)| e).collect();
        assert_eq!(applied, [id(1), id(3)], "{on:?}");
    }
}
