//! A dead-letter group is drained a page per call, read once and not
//! again at every page (issue 23, the twenty-first read: a group of N
//! letters read O(N²) of them to drain).

use super::*;
use serde_json::json;

/// 2,100 parked letters of one cause: discarded 1,000, 1,000 and 100 at a
/// time. A letter of the same cause parked after the first call comes only
/// once what that call kept has run out (the group is read again then),
/// which it would not if each page read the group again.
#[tokio::test]
async fn a_group_is_discarded_a_page_at_a_time_from_one_read() {
    let topic = unique("group-pages");
    create_topic(&topic, 1).await;
    let admin = start(Backend::Sqlite, &topic, "").await;
    let db = admin.env.db().await;
    let park = |from: i64, to: i64| {
        format!(
            "WITH RECURSIVE n(i) AS (SELECT {from} UNION ALL SELECT i + 1 FROM n WHERE i < {to}) \
             INSERT INTO dead_letters (handler, event_id, topic, partition, \"offset\", reason_kind, \
             reason, attempts, first_failed_at, last_failed_at, headers, payload) \
             SELECT 'billing', 'order-' || i, '{topic}', 0, i, 'rejected', \
             'order ' || i || ' was refused', 1, 0, 0, '[]', x'7b7d' FROM n"
        )
    };
    rows(&db, &park(1, 2_100)).await;

    let (status, groups) = admin.get("/v1/dead-letters/groups", Some(OPS_TOKEN)).await;
    assert_eq!(status, 200, "{groups}");
    assert_eq!(groups.as_array().map(Vec::len), Some(1), "{groups}");
    assert_eq!(groups[0]["count"], 2_100);
    let id = groups[0]["id"].as_str().expect("group id").to_owned();
    let discard = format!("/v1/dead-letters/groups/{id}/discard");

    let mut pages = Vec::new();
    loop {
        let (status, outcomes) = admin.post(&discard, OPS_TOKEN).await;
        if status == 404 {
            break;
        }
        assert_eq!(status, 200, "{outcomes}");
        let outcomes = outcomes.as_array().expect("outcomes").clone();
        assert!(
            outcomes.iter().all(|o| o["discarded"] == json!(true)),
            "{outcomes:?}"
        );
        pages.push(outcomes.len());
        if pages.len() == 1 {
            rows(&db, &park(2_101, 2_101)).await;
        }
        assert!(pages.len() < 10, "{pages:?}");
    }
    assert_eq!(pages, [1_000, 1_000, 100, 1], "the late letter comes last, alone");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM dead_letters WHERE resolution = 'discarded'"
        )
        .await,
        2_101
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM dead_letters WHERE resolution IS NULL").await,
        0
    );
}
