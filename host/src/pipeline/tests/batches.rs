//! Batches whose events end in the ordinary ways: applied, duplicate,
//! rejected, retried until they succeed, retried until they run out.

use super::harness::{Harness, MAX_ATTEMPTS, first_calls, id, optimistic_then, record, records};
use super::scripted::Act;
use crate::db::test_support::each_backend;
use crate::handler::{GuestFailure, LimitExceeded};
use crate::pipeline::{BatchCursor, BatchEnd, Fence, Outcome, PipelineError};

/// `(id(n), attempt)` rows of the handler's table, sorted.
fn effects(rows: &[(u32, i64)]) -> Vec<(String, i64)> {
    let mut rows: Vec<_> = rows.iter().map(|(n, attempt)| (id(*n), *attempt)).collect();
    rows.sort();
    rows
}

#[tokio::test]
async fn a_clean_batch_applies_each_event_once_with_its_messages_and_offset() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let ids = [1, 2, 3, 4, 5];
        for n in ids {
            h.handler.on(&id(n), vec![Act::Effect, Act::Publish("invoices")]);
        }
        let (end, cursor) = h.batch(&records(10, &ids)).await;
        let on = h.backend();
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        assert_eq!(
            cursor,
            BatchCursor {
                done: 5,
                fence: Fence::Partition(Some(15)),
                parked_keys: Vec::new()
            },
            "{on:?}"
        );
        assert_eq!(h.effects().await, effects(&ids.map(|n| (n, 1))), "{on:?}");
        for n in ids {
            assert_eq!(h.status(&id(n)).await.as_deref(), Some("done"), "{on:?}");
        }
        assert_eq!(h.offset().await, Some(15), "{on:?}: last offset + 1");
        let published: Vec<_> = ids.iter().map(|n| ("invoices".to_owned(), id(*n))).collect();
        assert_eq!(h.outbox().await, published, "{on:?}: in event order");
        assert_eq!(h.dead_letters().await, [], "{on:?}");
        assert_eq!(h.handler.call_order(), first_calls(&ids), "{on:?}");
    }
}

#[tokio::test]
async fn duplicates_in_a_batch_and_across_batches_run_once() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        // Event 1 twice in one batch, then 2 again in the next, then 3 on its own.
        let (end, _) = h.batch(&records(0, &[1, 2, 1, 3])).await;
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        assert_eq!(h.offset().await, Some(4), "{on:?}: the copy moves the offset too");
        let (end, _) = h.batch(&records(4, &[2, 4])).await;
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        assert_eq!(h.single(&record(6, &id(3))).await, Outcome::Duplicate, "{on:?}");
        assert_eq!(h.offset().await, Some(7), "{on:?}");
        assert_eq!(
            h.effects().await,
            effects(&[(1, 1), (2, 1), (3, 1), (4, 1)]),
            "{on:?}"
        );
        assert_eq!(h.handler.call_order(), first_calls(&[1, 2, 3, 4]), "{on:?}");
        assert_eq!(h.dead_letters().await, [], "{on:?}");
    }
}

#[tokio::test]
async fn a_rejected_event_is_parked_and_its_neighbours_apply_in_the_same_batch() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        for n in [1, 2, 3] {
            h.handler.on(&id(n), vec![Act::Effect, Act::Publish("invoices")]);
        }
        let reject = GuestFailure::Reject("order 2 is malformed".into());
        h.handler.on(
            &id(2),
            vec![Act::Effect, Act::Publish("invoices"), Act::Fail(reject)],
        );
        let (end, cursor) = h.batch(&records(0, &[1, 2, 3])).await;
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        assert_eq!(
            cursor,
            BatchCursor {
                done: 3,
                fence: Fence::Partition(Some(3)),
                parked_keys: Vec::new()
            },
            "{on:?}"
        );
        // Its own write and message went with it; its neighbours' did not.
        assert_eq!(h.effects().await, effects(&[(1, 1), (3, 1)]), "{on:?}");
        let published = vec![("invoices".to_owned(), id(1)), ("invoices".to_owned(), id(3))];
        assert_eq!(h.outbox().await, published, "{on:?}");
        let parked = h.only_dead_letter(on).await;
        assert_eq!(parked.said(), (Some(id(2).as_str()), 1, "rejected", 1), "{on:?}");
        let reason = &parked.reason;
        assert!(reason.contains("order 2 is malformed"), "{on:?}: {reason}");
        assert_eq!(h.status(&id(2)).await.as_deref(), Some("dead"), "{on:?}");
        assert_eq!(h.status(&id(3)).await.as_deref(), Some("done"), "{on:?}");
        assert_eq!(h.offset().await, Some(3), "{on:?}");
        // Event 2's reject ended the optimistic run (its undo took event 1's
        // work too); the run with a savepoint per call decided, never retrying it.
        assert_eq!(
            h.handler.call_order(),
            optimistic_then(&[1, 2, 3], 2, &[(1, 1), (2, 1), (3, 1)]),
            "{on:?}"
        );
        assert_eq!(
            h.guest_failures(),
            1,
            "{on:?}: counted once, by the run that decided"
        );
    }
}

#[tokio::test]
async fn a_retry_commits_the_events_before_it_and_runs_the_rest_after_it_in_order() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        let retry = GuestFailure::Retry("the ledger is busy".into());
        h.handler
            .on_attempt(&id(2), 1, vec![Act::Effect, Act::Fail(retry)]);
        // The second attempt sees what was committed before it: event 1 only.
        h.handler
            .on_attempt(&id(2), 2, vec![Act::CountEffects, Act::Effect]);
        let (end, cursor) = h.batch(&records(0, &[1, 2, 3, 4])).await;
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        assert_eq!(
            cursor,
            BatchCursor {
                done: 4,
                fence: Fence::Partition(Some(4)),
                parked_keys: Vec::new()
            },
            "{on:?}"
        );
        let order = optimistic_then(&[1, 2, 3, 4], 2, &[(1, 1), (2, 1), (2, 2), (3, 1), (4, 1)]);
        assert_eq!(h.handler.call_order(), order, "{on:?}");
        assert_eq!(h.guest_failures(), 1, "{on:?}");
        let second = h.handler.calls().into_iter().find(|c| c.attempt == 2).unwrap();
        assert_eq!(
            second.effects_seen,
            Some(1),
            "{on:?}: event 1 committed, 3 and 4 not run"
        );
        // Attempt 1's write was undone, and the optimistic run's with it: no effect twice.
        assert_eq!(
            h.effects().await,
            effects(&[(1, 1), (2, 2), (3, 1), (4, 1)]),
            "{on:?}"
        );
        for n in [1, 2, 3, 4] {
            assert_eq!(h.status(&id(n)).await.as_deref(), Some("done"), "{on:?}");
        }
        assert_eq!(h.offset().await, Some(4), "{on:?}");
        assert_eq!(h.dead_letters().await, [], "{on:?}");
    }
}

#[tokio::test]
async fn an_event_that_keeps_failing_is_parked_when_its_retries_run_out() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        // Every kind of failure but a reject is retried, and counts.
        let limit = LimitExceeded {
            key: "limits.timeout_ms",
            detail: "the call ran longer than 5000 ms".into(),
        };
        let failures = [
            GuestFailure::Retry("the ledger is busy".into()),
            GuestFailure::Trap("unreachable".into()),
            GuestFailure::Limit(limit),
        ];
        for (attempt, failure) in (1..).zip(failures) {
            h.handler
                .on_attempt(&id(2), attempt, vec![Act::Effect, Act::Fail(failure)]);
        }
        let (end, _) = h.batch(&records(0, &[1, 2, 3])).await;
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        let order = optimistic_then(&[1, 2, 3], 2, &[(1, 1), (2, 1), (2, 2), (2, 3), (3, 1)]);
        assert_eq!(h.handler.call_order(), order, "{on:?}");
        assert_eq!(h.guest_failures(), 3, "{on:?}: each attempt once");
        let parked = h.only_dead_letter(on).await;
        assert_eq!(
            parked.said(),
            (
                Some(id(2).as_str()),
                1,
                "retries-exhausted",
                i64::from(MAX_ATTEMPTS)
            ),
            "{on:?}"
        );
        let reason = &parked.reason;
        assert!(
            reason.contains("limits.timeout_ms"),
            "{on:?}: the last failure: {reason}"
        );
        assert_eq!(h.status(&id(2)).await.as_deref(), Some("dead"), "{on:?}");
        assert_eq!(h.effects().await, effects(&[(1, 1), (3, 1)]), "{on:?}");
        assert_eq!(h.offset().await, Some(3), "{on:?}");
    }
}

#[tokio::test]
async fn after_a_failure_the_handlers_next_batches_skip_the_optimistic_run() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        for n in [2, 5] {
            let reject = GuestFailure::Reject(format!("order {n} is malformed"));
            h.handler.on(&id(n), vec![Act::Effect, Act::Fail(reject)]);
        }
        assert_eq!(h.batch(&records(0, &[1, 2, 3])).await.0, BatchEnd::Done, "{on:?}");
        assert_eq!(h.batch(&records(3, &[4, 5, 6])).await.0, BatchEnd::Done, "{on:?}");
        let mut order = optimistic_then(&[1, 2, 3], 2, &[(1, 1), (2, 1), (3, 1)]);
        // The second batch ran a savepoint per call from the start: 5 ran once.
        order.extend(first_calls(&[4, 5, 6]));
        assert_eq!(h.handler.call_order(), order, "{on:?}");
        assert_eq!(
            h.effects().await,
            effects(&[(1, 1), (3, 1), (4, 1), (6, 1)]),
            "{on:?}"
        );
        assert_eq!(h.guest_failures(), 2, "{on:?}");
        assert_eq!(h.offset().await, Some(6), "{on:?}");
    }
}

/// Regression (the sixth read of this round, issue 23): a batch of slow
/// events held its transaction (on SQLite, the only writer) for all of
/// them. Now a batch commits what it did once it has run a second, and the
/// rest go in the next transaction: event 1 is committed while 2 still runs.
#[tokio::test]
async fn a_slow_batch_commits_in_parts_and_applies_each_event_once() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        let slow = std::time::Duration::from_millis(1_200);
        for n in [1, 2] {
            h.handler.on(&id(n), vec![Act::Effect, Act::Sleep(slow)]);
        }
        let watch = async {
            let started = std::time::Instant::now();
            while started.elapsed() < 2 * slow {
                let (one, two) = (h.status(&id(1)).await, h.status(&id(2)).await);
                if one.as_deref() == Some("done") && two.is_none() {
                    return true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            false
        };
        let batch = records(0, &[1, 2, 3]);
        let ((end, cursor), split) = tokio::join!(h.batch(&batch), watch);
        assert_eq!(end, BatchEnd::Done, "{on:?}");
        assert_eq!(cursor.done, 3, "{on:?}");
        assert!(split, "{on:?}: event 1 was committed before event 2 ended");
        assert_eq!(h.effects().await, effects(&[(1, 1), (2, 1), (3, 1)]), "{on:?}");
        assert_eq!(h.offset().await, Some(3), "{on:?}");
        assert_eq!(h.handler.call_order(), first_calls(&[1, 2, 3]), "{on:?}");
    }
}

/// Regression (the eleventh read of this round, issue 23): a stop (pause,
/// delete, restart, shutdown) was checked only in retry backoffs, so a
/// pump's stop waited for its whole batch of slow events, and the registry
/// waited with it. Now a batch ends after the transaction it is in: event 1
/// and 2 commit, 3 and 4 are left for whoever reads the partition next.
#[tokio::test]
async fn a_stopped_batch_ends_after_its_transaction() {
    for db in each_backend().await {
        let h = Harness::new(db).await;
        let on = h.backend();
        let slow = std::time::Duration::from_millis(600);
        for n in [1, 2, 3, 4] {
            h.handler.on(&id(n), vec![Act::Effect, Act::Sleep(slow)]);
        }
        let stop = async {
            let started = std::time::Instant::now();
            while started.elapsed() < 10 * slow {
                if h.status(&id(1)).await.is_none() && h.handler.call_order().len() == 1 {
                    h.shutdown.cancel();
                    return true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            false
        };
        let batch = records(0, &[1, 2, 3, 4]);
        let mut cursor = BatchCursor::new(h.offset().await);
        let started = std::time::Instant::now();
        let (end, stopped) = tokio::join!(h.pipeline.process_batch(&batch, &mut cursor, &h.shutdown), stop);
        assert!(stopped, "{on:?}: the stop came while event 1 ran");
        assert!(matches!(end, Err(PipelineError::Abandoned)), "{on:?}: {end:?}");
        assert!(started.elapsed() < 3 * slow, "{on:?}: {:?}", started.elapsed());
        assert_eq!(
            cursor.done, 2,
            "{on:?}: the transaction of events 1 and 2 committed"
        );
        assert_eq!(h.effects().await, effects(&[(1, 1), (2, 1)]), "{on:?}");
        assert_eq!(h.handler.call_order(), first_calls(&[1, 2]), "{on:?}");
        assert_eq!(h.status(&id(3)).await, None, "{on:?}");
    }
}
