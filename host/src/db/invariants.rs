//! The host's last check before committing a guest's work: its own rows for
//! this event are exactly as it left them. The walls should make this
//! impossible to fail; if it ever does, the transaction is rolled back and the
//! event parked as a sandbox violation instead of committing a broken promise.

use super::inbox::Claim;
use super::{DbError, SqlValue, Tx};

const CHECK: &str = "SELECT
    (SELECT status FROM inbox WHERE handler = $1 AND event_id = $2),
    (SELECT next_offset FROM offsets WHERE handler = $1 AND topic = $3 AND partition = $4)";

/// `None` if the claim row says `done` and the partition's offset row is still
/// `expected_offset`; otherwise what is wrong.
pub async fn violation(
    tx: &mut Tx,
    claim: &Claim<'_>,
    expected_offset: Option<i64>,
) -> Result<Option<String>, DbError> {
    let params = [
        claim.handler.into(),
        claim.event_id.into(),
        claim.topic.into(),
        claim.partition.into(),
    ];
    let rows = tx.query(CHECK, &params).await?;
    let (status, offset) = match rows.as_slice() {
        [row] if row.len() == 2 => (&row[0], &row[1]),
        _ => return Ok(Some("the invariant check returned no row".into())),
    };
    if status.as_str() != Some("done") {
        return Ok(Some(format!(
            "the event's inbox claim was changed or removed (status {status:?})"
        )));
    }
    let expected = expected_offset.map_or(SqlValue::Null, SqlValue::Int64);
    if *offset != expected {
        return Ok(Some(format!(
            "the partition's stored offset was changed (expected {expected:?}, found {offset:?})"
        )));
    }
    Ok(None)
}

/// As [`violation`], for a replay, which does not move the partition's offset
/// (and may run while a consumer does): only the claim row is checked.
pub async fn claim_violation(tx: &mut Tx, claim: &Claim<'_>) -> Result<Option<String>, DbError> {
    let rows = tx
        .query(
            "SELECT status FROM inbox WHERE handler = $1 AND event_id = $2",
            &[claim.handler.into(), claim.event_id.into()],
        )
        .await?;
    let status = rows.first().and_then(|r| r.first()).and_then(SqlValue::as_str);
    Ok((status != Some("done"))
        .then(|| format!("the event's inbox claim was changed or removed (status {status:?})")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::inbox;
    use crate::db::offsets::{self, Advance};
    use crate::db::test_support::memory_db;

    fn claim() -> Claim<'static> {
        Claim {
            handler: "h",
            event_id: "e1",
            topic: "t",
            partition: 0,
            offset: 9,
            handler_version: "v",
        }
    }

    #[tokio::test]
    async fn intact_rows_pass_and_tampered_ones_are_named() {
        let db = memory_db().await;
        let mut tx = db.begin().await.unwrap();
        let advance = Advance {
            handler: "h",
            topic: "t",
            partition: 0,
            expected: None,
            next_offset: 9,
            records: 9,
        };
        offsets::advance(&mut tx, &advance).await.unwrap();
        inbox::claim(&mut tx, &claim()).await.unwrap();
        assert_eq!(violation(&mut tx, &claim(), Some(9)).await.unwrap(), None);
        assert_eq!(claim_violation(&mut tx, &claim()).await.unwrap(), None);

        tx.execute("UPDATE offsets SET next_offset = 0", &[])
            .await
            .unwrap();
        let found = violation(&mut tx, &claim(), Some(9)).await.unwrap().unwrap();
        assert!(found.contains("stored offset was changed"), "{found}");

        tx.execute("DELETE FROM inbox", &[]).await.unwrap();
        let found = violation(&mut tx, &claim(), Some(0)).await.unwrap().unwrap();
        assert!(found.contains("claim was changed or removed"), "{found}");
        assert!(claim_violation(&mut tx, &claim()).await.unwrap().is_some());
    }
}
