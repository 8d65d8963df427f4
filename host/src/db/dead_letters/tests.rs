//! The `dead_letters` table: inserts, reads, resolutions and the holds of key order.

use super::*;
use crate::db::test_support::{each_backend, sqlite_db};

#[tokio::test]
async fn insert_and_list_keep_the_reason() {
    let db = sqlite_db().await;
    let headers = vec![
        ("trace".to_owned(), b"abc".to_vec()),
        ("bin".to_owned(), vec![0xff, 0x00]),
    ];
    let mut tx = db.begin().await.unwrap();
    insert(
        &mut tx,
        &DeadLetter {
            handler: "billing",
            event_id: None,
            topic: "orders",
            partition: 2,
            offset: 41,
            key: Some(b"k"),
            payload: b"not json",
            headers: &headers,
            kind: ReasonKind::EventId,
            reason: "missing event id",
            attempts: 0,
            handler_version: None,
            first_failed_at: now_ms(),
            record_bytes: None,
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let listed = list(&db, "billing").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].kind, ReasonKind::EventId);
    assert_eq!(listed[0].reason, "missing event id");
    assert_eq!((listed[0].partition, listed[0].offset), (2, 41));
    assert_eq!(
        headers_json(&headers),
        r#"[{"name":"trace","value":"abc"},{"name":"bin","hex":"ff00"}]"#
    );
}

/// A dead letter the host cannot read back fails the list with the
/// column's name: before, `find` skipped it, and an operator never saw
/// the event again.
#[tokio::test]
async fn a_dead_letter_that_cannot_be_read_fails_the_list_naming_its_column() {
    let db = sqlite_db().await;
    let mut tx = db.begin().await.unwrap();
    let letter = DeadLetter {
        handler: "billing",
        event_id: Some("e"),
        topic: "orders",
        partition: 0,
        offset: 1,
        key: None,
        payload: b"{}",
        headers: &[],
        kind: ReasonKind::Rejected,
        reason: "no",
        attempts: 1,
        handler_version: None,
        first_failed_at: now_ms(),
        record_bytes: None,
    };
    insert(&mut tx, &letter).await.unwrap();
    // SQLite keeps text in an INTEGER column: a damaged row.
    tx.execute("UPDATE dead_letters SET attempts = 'many'", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let err = list(&db, "billing").await.unwrap_err().to_string();
    assert_eq!(
        err,
        "reading a dead_letters row: column attempts holds text where an integer was expected"
    );
}

#[tokio::test]
async fn a_list_filters_by_scope_and_kind_in_the_query_and_leaves_the_record_out() {
    for db in each_backend().await {
        let mut tx = db.begin().await.unwrap();
        for (offset, (handler, kind)) in [
            ("billing", ReasonKind::Rejected),
            ("billing", ReasonKind::Limit),
            ("emails", ReasonKind::Rejected),
            ("billing", ReasonKind::Rejected),
        ]
        .into_iter()
        .enumerate()
        {
            let letter = DeadLetter {
                handler,
                event_id: Some("e"),
                topic: "orders",
                partition: 0,
                offset: offset as i64,
                key: Some(b"k"),
                payload: b"{}",
                headers: &[],
                kind,
                reason: "no",
                attempts: 1,
                handler_version: None,
                first_failed_at: now_ms(),
                record_bytes: None,
            };
            insert(&mut tx, &letter).await.unwrap();
        }
        tx.commit().await.unwrap();
        let offsets = |rows: Vec<Row>| rows.iter().map(|r| r.offset).collect::<Vec<_>>();
        let billing = ["billing".to_owned()];
        let scoped = Filter {
            handlers: Some(&billing),
            kind: Some(ReasonKind::Rejected),
            without_record: true,
            ..Filter::default()
        };
        let rows = find(&db, &scoped).await.unwrap();
        assert!(rows.iter().all(|r| r.payload.is_empty() && r.key.is_none()));
        assert_eq!(offsets(rows), [0, 3], "{:?}", db.backend());
        let limited = Filter {
            limit: Some(2),
            ..Filter::default()
        };
        assert_eq!(offsets(find(&db, &limited).await.unwrap()), [0, 1]);
        let nobody = Filter {
            handlers: Some(&[]),
            ..Filter::default()
        };
        assert!(find(&db, &nobody).await.unwrap().is_empty());
        let whole = find(&db, &Filter::default()).await.unwrap();
        assert_eq!(whole[0].payload, b"{}");
    }
}

/// Regression (issue 23, fourth read): the letters held behind a parked
/// one were read all at once, records included (a key may hold 100,000).
/// They are read a few at a time, in offset order, up to the key's next
/// parked letter that is not held.
#[tokio::test]
async fn held_letters_are_read_a_few_at_a_time_in_offset_order() {
    for db in each_backend().await {
        let letter = |offset: i64, kind: ReasonKind| DeadLetter {
            handler: "billing",
            event_id: Some("e"),
            topic: "orders",
            partition: 0,
            offset,
            key: Some(b"k"),
            payload: b"{}",
            headers: &[],
            kind,
            reason: "r",
            attempts: 1,
            handler_version: None,
            first_failed_at: now_ms(),
            record_bytes: None,
        };
        let mut tx = db.begin().await.unwrap();
        insert(&mut tx, &letter(10, ReasonKind::Rejected)).await.unwrap();
        for offset in [14, 11, 13, 12] {
            insert(&mut tx, &letter(offset, ReasonKind::Held)).await.unwrap();
        }
        // The key's next parked letter: what is held after it waits for it.
        insert(&mut tx, &letter(15, ReasonKind::Rejected)).await.unwrap();
        insert(&mut tx, &letter(16, ReasonKind::Held)).await.unwrap();
        tx.commit().await.unwrap();
        let first = &find(&db, &Filter::default()).await.unwrap()[0];
        assert_eq!(first.offset, 10);
        let offsets = |limit| {
            let db = db.clone();
            async move {
                let held = held_behind(&db, first, limit).await.unwrap();
                held.iter().map(|row| row.offset).collect::<Vec<_>>()
            }
        };
        assert_eq!(offsets(2).await, [11, 12], "{:?}", db.backend());
        assert_eq!(offsets(100).await, [11, 12, 13, 14], "{:?}", db.backend());
    }
}

/// Regression (the twelfth read of issue 23's third round): key order read
/// every blocked key of a partition whole, at once, and held each for good
/// (a megabyte key a megabyte). Now it reads them a page at a time and
/// keeps digests: every blocking key is found, a letter without an event id
/// or resolved blocks none, and keys of another partition are not read.
#[tokio::test]
async fn blocked_keys_are_read_in_pages_as_digests() {
    fn letter<'a>(
        handler: &'a str,
        offset: i64,
        key: &'a [u8],
        partition: i32,
        event_id: Option<&'a str>,
    ) -> DeadLetter<'a> {
        DeadLetter {
            handler,
            event_id,
            topic: "orders",
            partition,
            offset,
            key: Some(key),
            payload: b"{}",
            headers: &[],
            kind: ReasonKind::Rejected,
            reason: "r",
            attempts: 1,
            handler_version: None,
            first_failed_at: now_ms(),
            record_bytes: None,
        }
    }
    for db in each_backend().await {
        let handler = format!("blocked_{:?}", db.backend()).to_lowercase();
        let mut keys: Vec<Vec<u8>> = (0..40)
            .map(|i| format!("key-{i:03}-{}", "x".repeat(i)).into_bytes())
            .collect();
        // 8 KB that do not compress: past a PostgreSQL btree entry's 2,704
        // bytes, so such a letter could not be written at all (the
        // thirteenth read): the index holds the key's digest.
        keys.push((0..256u16).flat_map(|i| key_digest(&i.to_be_bytes())).collect());
        let mut tx = db.begin().await.unwrap();
        for (i, key) in keys.iter().enumerate() {
            let at = i as i64;
            insert(&mut tx, &letter(&handler, at, key, 0, Some("e")))
                .await
                .unwrap();
            // A second letter of the same key: read once.
            insert(&mut tx, &letter(&handler, 100 + at, key, 0, Some("e")))
                .await
                .unwrap();
        }
        insert(&mut tx, &letter(&handler, 200, b"no-id", 0, None))
            .await
            .unwrap();
        insert(&mut tx, &letter(&handler, 201, b"elsewhere", 1, Some("e")))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let read = blocked_keys(&db, &handler, "orders", 0, usize::MAX)
            .await
            .unwrap();
        let wanted: std::collections::HashSet<KeyDigest> = keys.iter().map(|k| key_digest(k)).collect();
        assert_eq!(read, wanted, "{:?}", db.backend());
        assert!(!read.contains(&key_digest(b"no-id")));
        assert!(!read.contains(&key_digest(b"elsewhere")));
        // A bound stops the read within a page of it.
        let some = blocked_keys(&db, &handler, "orders", 0, 20).await.unwrap();
        assert!(some.len() >= 20 && some.is_subset(&wanted), "{}", some.len());
        // The long key is found by the lookups a batch and a hold make.
        let long = keys.last().unwrap().as_slice();
        let mut tx = db.begin().await.unwrap();
        let among = blocked_among(&mut tx, &handler, "orders", 0, &[long, b"free"])
            .await
            .unwrap();
        assert_eq!(
            among.into_iter().collect::<Vec<_>>(),
            [long.to_vec()],
            "{:?}",
            db.backend()
        );
        let at = KeyAt {
            handler: &handler,
            topic: "orders",
            partition: 0,
            key: long,
        };
        assert_eq!(
            first_blocking(&mut tx, &at, false).await.unwrap().map(|(_, o)| o),
            Some(40)
        );
        tx.rollback().await.unwrap();
    }
}

/// Regression (the fifteenth read of issue 23's third round): a reason was
/// stored whole, and a list of 1,000 letters read every one: a reason that
/// quoted a megabyte record made lists of gigabytes. A reason keeps its
/// first 4 KiB, cut on a character boundary and marked.
#[tokio::test]
async fn a_reason_is_stored_cut_to_its_bound() {
    let db = sqlite_db().await;
    let reason = format!("ü{}", "é".repeat(1 << 20));
    let mut tx = db.begin().await.unwrap();
    insert(
        &mut tx,
        &DeadLetter {
            handler: "billing",
            event_id: None,
            topic: "orders",
            partition: 0,
            offset: 1,
            key: None,
            payload: b"{}",
            headers: &[],
            kind: ReasonKind::EventId,
            reason: &reason,
            attempts: 0,
            handler_version: None,
            first_failed_at: now_ms(),
            record_bytes: None,
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let stored = &list(&db, "billing").await.unwrap()[0].reason;
    assert!(stored.len() <= MAX_REASON_BYTES + 8, "{}", stored.len());
    assert!(stored.starts_with("üé") && stored.ends_with(" [cut]"));
    // NULs are replaced (three bytes each) before the cut (the sixteenth read).
    assert!(storable(&"\0".repeat(1 << 20)).len() <= MAX_REASON_BYTES + 8);
}

/// Regression (issue 23, seventeenth read of its third round): SQLite keeps a
/// row's columns in order and a large value on a chain of overflow pages
/// that is walked to reach what follows it, so a list of letters (or of
/// parked outbox messages) read every payload to get to the reason and the
/// times. Key, headers and payload are each table's last columns, and the
/// rebuild kept every id's high-water mark (no id is used twice).
#[tokio::test]
async fn on_sqlite_the_record_columns_come_last() {
    let db = sqlite_db().await;
    for table in ["dead_letters", "outbox"] {
        let rows = db
            .query(
                &format!("SELECT name FROM pragma_table_info('{table}') ORDER BY cid"),
                &[],
            )
            .await
            .unwrap();
        let names: Vec<String> = rows
            .into_iter()
            .map(|row| match &row[0] {
                SqlValue::Text(name) => name.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            names[names.len() - 3..],
            ["key", "headers", "payload"],
            "{table}: {names:?}"
        );
    }
}

/// A detail shows text as text, and bytes that are not text (control
/// characters, six bytes each once in JSON, or not UTF-8) as hex.
#[test]
fn bytes_are_shown_as_text_only_when_they_are_text() {
    assert_eq!(bytes_text(b"line one\nline\ttwo\r"), "line one\nline\ttwo\r");
    assert_eq!(bytes_text(&[1, 1]), "<2 bytes, not text> 0101");
    assert_eq!(bytes_text(&[0xff]), "<1 bytes, not UTF-8> ff");
}
