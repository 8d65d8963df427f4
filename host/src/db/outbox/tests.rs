//! The outbox table: writes in the handler's transaction, leases, publishing, parking,
//! re-queueing and purging.

use super::*;
use crate::db::test_support::{each_backend, sqlite_db};

fn message(key: &str) -> NewMessage {
    NewMessage {
        id: uuid::Uuid::now_v7().to_string(),
        topic: "invoices".into(),
        key: Some(key.as_bytes().to_vec()),
        payload: b"{}".to_vec(),
        headers: vec![("traceparent".into(), b"00-x".to_vec())],
    }
}

#[test]
fn buckets_are_stable_and_spread() {
    assert_eq!(
        bucket("billing", Some(b"order-1")),
        bucket("billing", Some(b"order-1"))
    );
    let spread: std::collections::HashSet<i64> = (0..1000)
        .map(|i| bucket("billing", Some(format!("k{i}").as_bytes())))
        .collect();
    assert!(spread.len() > 50, "{}", spread.len());
}

/// `outbox.retention = "0s"` (the default): a sent message is deleted as
/// it is settled; a positive retention keeps it marked for the purge.
#[tokio::test]
async fn sent_messages_are_deleted_unless_kept() {
    assert_eq!(Settle::after(std::time::Duration::ZERO), Settle::Delete);
    assert_eq!(Settle::after(std::time::Duration::from_secs(1)), Settle::Keep);
    for db in each_backend().await {
        let handler = format!("sent_{:?}", db.backend()).to_lowercase();
        let messages = [message("a"), message("b"), message("c")];
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, &handler, &messages).await.unwrap();
        tx.commit().await.unwrap();
        let buckets: Vec<i64> = (0..BUCKETS as i64).collect();
        let rows: Vec<Pending> = pending(&db, &buckets, Read::messages(10), &[])
            .await
            .unwrap()
            .into_iter()
            .filter(|p| messages.iter().any(|m| m.id == p.message.id))
            .collect();
        assert_eq!(rows.len(), 3);
        settle_sent(&db, &[rows[0].seq], Settle::Delete).await.unwrap();
        settle_sent(&db, &[rows[1].seq], Settle::Keep).await.unwrap();
        let count = |sql: &'static str| {
            let (db, handler) = (db.clone(), handler.clone());
            async move {
                db.query(sql, &[handler.into()]).await.unwrap()[0][0]
                    .as_i64()
                    .unwrap()
            }
        };
        assert_eq!(
            count("SELECT COUNT(*) FROM outbox WHERE handler = $1").await,
            2,
            "the deleted one is gone"
        );
        assert_eq!(
            count("SELECT COUNT(*) FROM outbox WHERE handler = $1 AND published_at IS NOT NULL").await,
            1,
            "the kept one is marked"
        );
        assert_eq!(backlog(&db, &handler).await.unwrap().0, 1, "one still to send");
    }
}

/// Regression (issue 23, third read): the relay's read had no byte bound,
/// and 64 buckets of 200 one-megabyte messages came into the host in one
/// look. A read now takes the buckets' messages in turns while their sizes
/// add up to its budget, a prefix of each bucket's line.
#[tokio::test]
async fn a_read_takes_turns_within_its_byte_budget() {
    for db in each_backend().await {
        let sized = |key: &str| NewMessage {
            payload: vec![b'x'; 567],
            headers: Vec::new(),
            ..message(key)
        };
        // Two keys in different buckets, `low` in the lower-numbered one
        // (turns go by bucket number). Every message counts 1,000 bytes: 384
        // of overhead, an id of 36, the topic's 8, a key of 1, a payload of
        // 567 and twice the 2 of `[]`, the headers as stored.
        let bucket_of = |key: &str| bucket("big", Some(key.as_bytes()));
        let mut keys: Vec<String> = ('a'..='z').map(String::from).collect();
        keys.sort_by_key(|key| bucket_of(key));
        keys.dedup_by_key(|key| bucket_of(key));
        let (low, high) = (&keys[0], &keys[1]);
        let messages = [sized(low), sized(low), sized(low), sized(high), sized(high)];
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, "big", &messages).await.unwrap();
        tx.commit().await.unwrap();
        let held = lease(&db, "host-1", 10_000).await.unwrap();
        let sent: Vec<String> = messages.iter().map(|m| m.id.clone()).collect();
        let ids = |read: Read| {
            let (db, held, sent) = (db.clone(), held.clone(), sent.clone());
            async move {
                let rows = pending(&db, &held, read, &[]).await.unwrap();
                rows.iter()
                    .map(|p| sent.iter().position(|id| *id == p.message.id).unwrap())
                    .collect::<Vec<_>>()
            }
        };
        let read = |per_bucket, bytes, at_least_one| Read {
            per_bucket,
            bytes,
            at_least_one,
        };
        assert_eq!(
            ids(Read::messages(10)).await,
            [0, 1, 2, 3, 4],
            "{:?}",
            db.backend()
        );
        // Turns: low's first, high's first, low's second (3,000 bytes), high's second...
        assert_eq!(ids(read(10, 3_000, true)).await, [0, 1, 3], "{:?}", db.backend());
        assert_eq!(ids(read(10, 3_999, false)).await, [0, 1, 3]);
        assert_eq!(ids(read(1, 10_000, false)).await, [0, 3], "per bucket");
        assert_eq!(ids(read(10, 500, true)).await, [0], "one over the budget, alone");
        assert!(ids(read(10, 500, false)).await.is_empty(), "none over the budget");
        // What a read counts is at least what the host then holds.
        assert!(
            messages.iter().all(|m| m.bytes() <= 1_000),
            "{}",
            messages[0].bytes()
        );
    }
}

#[tokio::test]
async fn messages_commit_with_the_transaction_and_relay_in_order() {
    let db = sqlite_db().await;
    let mut tx = db.begin().await.unwrap();
    insert(&mut tx, "billing", &[message("a"), message("b")])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        backlog(&db, "billing").await.unwrap().0,
        0,
        "rolled back with the handler's writes"
    );

    let first = message("a");
    let second = message("a");
    let mut tx = db.begin().await.unwrap();
    insert(&mut tx, "billing", &[first.clone(), second.clone()])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(backlog(&db, "billing").await.unwrap().0, 2);

    let held = lease(&db, "host-1", 10_000).await.unwrap();
    assert_eq!(held.len() as u64, BUCKETS);
    assert!(
        lease(&db, "host-2", 10_000).await.unwrap().is_empty(),
        "one relay per bucket at a time"
    );
    let rows = pending(&db, &held, Read::messages(10), &[]).await.unwrap();
    assert_eq!(
        rows.iter().map(|p| p.message.id.clone()).collect::<Vec<_>>(),
        [first.id, second.id]
    );
    assert_eq!(rows[0].message.headers, first.headers);
    settle_sent(&db, &[rows[0].seq], Settle::Keep).await.unwrap();
    assert_eq!(
        pending(&db, &held, Read::messages(10), &[]).await.unwrap().len(),
        1
    );
    release(&db, "host-1").await.unwrap();
    assert_eq!(
        lease(&db, "host-2", 10_000).await.unwrap().len() as u64,
        BUCKETS,
        "released leases move on"
    );
    assert_eq!(purge_published(&db, now_ms() + 1, 100).await.unwrap(), 1);
}

#[tokio::test]
async fn a_batch_of_messages_keeps_its_order_and_its_bytes_across_insert_chunks() {
    for db in each_backend().await {
        // 100 = 64 + 32 + 4: three statements on SQLite, one on PostgreSQL.
        // Keys absent, text and binary; payloads and header values that are
        // not UTF-8: every byte must come back as it went in.
        let messages: Vec<NewMessage> = (0..100u8)
            .map(|i| NewMessage {
                key: match i % 3 {
                    0 => None,
                    1 => Some(b"same-key".to_vec()),
                    _ => Some(vec![0xff, 0x00, i]),
                },
                payload: vec![0xfe, 0x00, b'"', b'\\', i],
                headers: vec![("bin".into(), vec![0xc3, i]), ("text".into(), b"\"x\"".to_vec())],
                ..message("unused")
            })
            .collect();
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, "billing", &messages).await.unwrap();
        insert(&mut tx, "billing", &[]).await.unwrap();
        tx.commit().await.unwrap();
        let held = lease(&db, "host-1", 10_000).await.unwrap();
        let rows = pending(&db, &held, Read::messages(1_000), &[]).await.unwrap();
        let mut sent: Vec<&NewMessage> = messages.iter().collect();
        // The relay reads bucket by bucket, in insert order within each.
        sent.sort_by_key(|m| bucket("billing", m.key.as_deref()));
        let read: Vec<&NewMessage> = rows.iter().map(|p| &p.message).collect();
        assert_eq!(read, sent, "{:?}", db.backend());
        for row in &rows {
            assert_eq!(row.bucket, bucket("billing", row.message.key.as_deref()));
        }
    }
}

#[test]
fn a_postgresql_statement_carries_a_bounded_share_of_a_batch() {
    let sized = |bytes: usize| NewMessage {
        payload: vec![0; bytes],
        ..message("k")
    };
    let overhead = sized(0).bytes();
    let limit = 10_000;
    let small: Vec<NewMessage> = (0..10).map(|_| sized(10)).collect();
    assert_eq!(
        statement_share(&small, limit),
        10,
        "a batch within the bound goes whole"
    );
    let halves: Vec<NewMessage> = (0..5).map(|_| sized(limit / 2 - overhead)).collect();
    assert_eq!(statement_share(&halves, limit), 2);
    let huge = [sized(limit * 3), sized(1)];
    assert_eq!(
        statement_share(&huge, limit),
        1,
        "a message over the bound goes alone"
    );
    assert_eq!(statement_share(&huge[1..], limit), 1);
}

/// Two keys of one handler that land in different buckets.
fn keys_in_two_buckets() -> (String, String) {
    let first = "k0".to_owned();
    let other = (1..)
        .map(|i| format!("k{i}"))
        .find(|k| bucket("billing", Some(k.as_bytes())) != bucket("billing", Some(first.as_bytes())))
        .unwrap();
    (first, other)
}

/// Regression: `ORDER BY bucket, seq LIMIT n` let one bucket's backlog
/// fill every read, so the other buckets never moved.
#[tokio::test]
async fn a_long_backlog_in_one_bucket_does_not_starve_the_others() {
    let db = sqlite_db().await;
    let (busy, quiet) = keys_in_two_buckets();
    let (low, high) = if bucket("billing", Some(busy.as_bytes())) < bucket("billing", Some(quiet.as_bytes()))
    {
        (busy, quiet)
    } else {
        (quiet, busy)
    };
    let backlog: Vec<NewMessage> = (0..50).map(|_| message(&low)).collect();
    let late = message(&high);
    let mut tx = db.begin().await.unwrap();
    insert(&mut tx, "billing", &backlog).await.unwrap();
    insert(&mut tx, "billing", std::slice::from_ref(&late))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let held = lease(&db, "host-1", 10_000).await.unwrap();
    let rows = pending(&db, &held, Read::messages(10), &[]).await.unwrap();
    assert_eq!(rows.len(), 11, "10 of the long bucket, and the other one");
    assert_eq!(rows[10].message.id, late.id);
    assert_eq!(
        rows[..10]
            .iter()
            .map(|p| p.message.id.as_str())
            .collect::<Vec<_>>(),
        backlog[..10].iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
        "the oldest of the long bucket, in order"
    );
}

#[tokio::test]
async fn a_parked_message_steps_aside_until_requeued_or_discarded() {
    let db = sqlite_db().await;
    let (stuck, next) = (message("a"), message("a"));
    let mut tx = db.begin().await.unwrap();
    insert(&mut tx, "billing", &[stuck.clone(), next.clone()])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let held = lease(&db, "host-1", 10_000).await.unwrap();
    let rows = pending(&db, &held, Read::messages(10), &[]).await.unwrap();
    let (stuck_seq, next_seq) = (rows[0].seq, rows[1].seq);

    assert!(park(&db, stuck_seq, "Broker: Invalid topic").await.unwrap());
    assert!(!park(&db, stuck_seq, "again").await.unwrap(), "parked once");
    let rows = pending(&db, &held, Read::messages(10), &[]).await.unwrap();
    assert_eq!(
        rows.iter().map(|p| p.seq).collect::<Vec<_>>(),
        [next_seq],
        "the bucket's next message goes on"
    );
    assert_eq!(
        backlog(&db, "billing").await.unwrap().0,
        1,
        "parked is not backlog"
    );
    assert_eq!(
        parked_counts(&db).await.unwrap(),
        [("billing".to_owned(), 1)].into()
    );
    let listed = parked(
        &db,
        &ParkedFilter {
            handler: Some("billing"),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].id.as_str(),
            listed[0].reason.as_deref(),
            listed[0].attempts
        ),
        (stuck.id.as_str(), Some("Broker: Invalid topic"), 1)
    );
    assert_eq!(listed[0].payload, stuck.payload);
    // A list leaves the record out (it would read every payload) and says
    // how large the payload is.
    let summary = parked(
        &db,
        &ParkedFilter {
            handler: Some("billing"),
            without_record: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        (
            summary[0].id.as_str(),
            summary[0].payload.len(),
            summary[0].key.as_ref(),
            summary[0].headers.len(),
            summary[0].payload_bytes
        ),
        (stuck.id.as_str(), 0, None, 0, stuck.payload.len() as i64)
    );
    assert_eq!(listed[0].payload_bytes, stuck.payload.len() as i64);
    assert!(
        parked(
            &db,
            &ParkedFilter {
                handler: Some("other"),
                ..Default::default()
            }
        )
        .await
        .unwrap()
        .is_empty()
    );

    assert_eq!(requeue_all(&db, "other").await.unwrap(), 0, "scoped by handler");
    assert_eq!(requeue(&db, "billing", &[stuck_seq]).await.unwrap(), [stuck_seq]);
    let rows = pending(&db, &held, Read::messages(10), &[]).await.unwrap();
    assert_eq!(
        rows.iter().map(|p| p.seq).collect::<Vec<_>>(),
        [stuck_seq, next_seq],
        "re-queued in its old place"
    );

    park(&db, stuck_seq, "still invalid").await.unwrap();
    assert!(!discard(&db, "other", stuck_seq).await.unwrap());
    assert!(discard(&db, "billing", stuck_seq).await.unwrap());
    assert!(!discard(&db, "billing", stuck_seq).await.unwrap(), "once");
    assert!(
        !discard(&db, "billing", next_seq).await.unwrap(),
        "only a parked one"
    );
    assert!(
        requeue_all(&db, "billing").await.unwrap() == 0,
        "discarded stays discarded"
    );
    assert!(parked_counts(&db).await.unwrap().is_empty());
    let all = ParkedFilter {
        include_discarded: true,
        ..Default::default()
    };
    assert!(parked(&db, &all).await.unwrap()[0].discarded_at.is_some());
    settle_sent(&db, &[next_seq], Settle::Keep).await.unwrap();
    assert_eq!(
        purge_published(&db, now_ms() + 1, 100).await.unwrap(),
        2,
        "discarded ones are purged too"
    );
}

/// Regression (issue 27): a message whose row cannot be read was skipped by
/// the relay's read and by the parked list, every time, without a word: a
/// message nobody would ever send or see. Now the read fails and names the
/// column.
#[tokio::test]
async fn an_unreadable_message_row_fails_the_read_and_names_its_column() {
    for db in each_backend().await {
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, "billing", &[message("a")]).await.unwrap();
        tx.commit().await.unwrap();
        let held = lease(&db, "host-1", 10_000).await.unwrap();
        let seq = pending(&db, &held, Read::messages(10), &[]).await.unwrap()[0].seq;
        let mut tx = db.begin().await.unwrap();
        tx.execute(
            "UPDATE outbox SET headers = 'not json' WHERE seq = $1",
            &[seq.into()],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();

        let error = pending(&db, &held, Read::messages(10), &[])
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("outbox row") && error.contains("headers"),
            "{error}"
        );
        assert!(park(&db, seq, "Broker: Invalid topic").await.unwrap());
        let error = parked(&db, &ParkedFilter::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("outbox row") && error.contains("headers"),
            "{error}"
        );
    }
}

/// Regression (the tenth read of this round, issue 23): re-queueing every
/// parked message was one UPDATE, which held SQLite's only writer for
/// seconds at a million rows. Now pages of `REQUEUE_PAGE`, each its own write.
#[tokio::test]
async fn requeue_all_goes_a_page_at_a_time_and_counts_every_message() {
    for db in each_backend().await {
        let messages: Vec<NewMessage> = (0..REQUEUE_PAGE * 2 + 5)
            .map(|i| message(&format!("k{i}")))
            .collect();
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, "bulk", &messages).await.unwrap();
        tx.commit().await.unwrap();
        let mut tx = db.begin().await.unwrap();
        tx.execute("UPDATE outbox SET parked_at = 1 WHERE handler = 'bulk'", &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            requeue_all(&db, "bulk").await.unwrap(),
            (REQUEUE_PAGE * 2 + 5) as u64,
            "{:?}",
            db.backend()
        );
        assert!(parked_counts(&db).await.unwrap().is_empty(), "{:?}", db.backend());
    }
}

/// Regression (the seventeenth read of this round, issue 23): a page was a
/// thousand messages whatever their size, and SQLite writes an updated row
/// whole. A page now also stops at its bytes (one message at least).
#[tokio::test]
async fn requeue_all_pages_are_bounded_in_bytes() {
    for db in each_backend().await {
        let messages: Vec<NewMessage> = (0..10).map(|i| message(&format!("k{i}"))).collect();
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, "heavy", &messages).await.unwrap();
        tx.commit().await.unwrap();
        let mut tx = db.begin().await.unwrap();
        // Each 4 MiB (on SQLite, one sized from its columns, as if written
        // before hosts stored the size).
        let payload = SqlValue::Blob(vec![b'x'; 4 << 20]);
        tx.execute(
            "UPDATE outbox SET parked_at = 1, payload = $1 WHERE handler = 'heavy'",
            std::slice::from_ref(&payload),
        )
        .await
        .unwrap();
        if db.backend() == Backend::Sqlite {
            tx.execute("UPDATE outbox SET bytes = NULL WHERE handler = 'heavy'", &[])
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        let (count, pages) = requeue_in_pages(&db, "heavy", 10 << 20).await.unwrap();
        // Three of 4 MiB fit under 10 MiB (the third starts at 8): 3, 3, 3, 1.
        assert_eq!((count, pages), (10, 4), "{:?}", db.backend());
        assert!(parked_counts(&db).await.unwrap().is_empty(), "{:?}", db.backend());
    }
}

/// Regression (the eleventh adversarial read, issue 23): the relay parked
/// each message in a write of its own, so a team's thousands of messages to
/// a quarantined topic held every bucket. `park_all` parks a round's worth
/// in one write, each with its own reason, and skips what was sent meanwhile.
#[tokio::test]
async fn a_rounds_parked_messages_are_written_together_with_their_reasons() {
    for db in each_backend().await {
        let handler = format!("park_all_{:?}", db.backend()).to_lowercase();
        let messages: Vec<NewMessage> = (0..3_000).map(|i| message(&format!("k{i}"))).collect();
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, &handler, &messages).await.unwrap();
        tx.commit().await.unwrap();
        let seqs = ints(
            db.query(
                "SELECT seq FROM outbox WHERE handler = $1 ORDER BY seq",
                &[handler.as_str().into()],
            )
            .await
            .unwrap(),
            "outbox row",
            "seq",
        )
        .unwrap();
        assert_eq!(seqs.len(), 3_000);
        settle_sent(&db, &seqs[..1], Settle::Keep).await.unwrap();
        let parked: Vec<(i64, String)> = seqs
            .iter()
            .enumerate()
            .map(|(i, seq)| (*seq, format!("reason {}", i % 2)))
            .collect();
        assert_eq!(
            park_all(&db, &parked).await.unwrap(),
            2_999,
            "all but the one sent"
        );
        assert_eq!(park_all(&db, &parked).await.unwrap(), 0, "parked once");
        let listed = outbox_parked(&db, &handler).await;
        assert_eq!(listed.len(), 2_999);
        for p in &listed {
            let i = seqs.iter().position(|s| *s == p.seq).unwrap();
            assert_eq!(p.reason.as_deref(), Some(format!("reason {}", i % 2).as_str()));
        }
        assert_eq!(backlog(&db, &handler).await.unwrap().0, 0);
    }
}

async fn outbox_parked(db: &Database, handler: &str) -> Vec<Parked> {
    parked(
        db,
        &ParkedFilter {
            handler: Some(handler),
            seqs: None,
            include_discarded: false,
            limit: 5_000,
            without_record: true,
        },
    )
    .await
    .unwrap()
}

/// The relay's read leaves out the handlers it names (those backing off
/// after a passing failure), on both backends, whatever bucket they share.
#[tokio::test]
async fn a_read_leaves_out_the_handlers_backing_off() {
    for db in each_backend().await {
        let on = db.backend();
        let shared = bucket("waits", Some(b"k"));
        let their_key = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| bucket("goes", Some(k.as_bytes())) == shared)
            .unwrap();
        for (handler, key) in [
            ("waits", "k".to_owned()),
            ("goes", their_key),
            ("quote\"s", "q".to_owned()),
        ] {
            let mut tx = db.begin().await.unwrap();
            insert(&mut tx, handler, &[message(&key)]).await.unwrap();
            tx.commit().await.unwrap();
        }
        let held = lease(&db, "host-1", 10_000).await.unwrap();
        let handlers = |rows: Vec<Pending>| {
            let mut names: Vec<String> = rows.into_iter().map(|p| p.handler).collect();
            names.sort();
            names
        };
        let all = pending(&db, &held, Read::messages(10), &[]).await.unwrap();
        assert_eq!(handlers(all), ["goes", "quote\"s", "waits"], "{on:?}");
        let skip = ["waits".to_owned(), "quote\"s".to_owned()];
        let some = pending(&db, &held, Read::messages(10), &skip).await.unwrap();
        assert_eq!(handlers(some), ["goes"], "{on:?}");
    }
}
