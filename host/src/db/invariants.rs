//! The host's last check before committing a guest's work: its own rows for
//! this event are exactly as it left them. The walls should make this
//! impossible to fail; if it ever does, the transaction is rolled back and the
//! event parked as a sandbox violation instead of committing a broken promise.

use super::inbox::Claim;
use super::{DbError, SqlValue, Tx};

/// The event ids in one batch are few (`max_batch`), so one statement with a
/// parameter each checks them all.
fn check_sql(claims: usize) -> String {
    let ids: Vec<String> = (0..claims).map(|i| format!("${}", i + 4)).collect();
    format!(
        "SELECT
    (SELECT COUNT(*) FROM inbox WHERE handler = $1 AND status = 'done' AND event_id IN ({})),
    (SELECT next_offset FROM offsets WHERE handler = $1 AND topic = $2 AND partition = $3)",
        ids.join(", ")
    )
}

/// The partition a batch advances, as the host last saw it.
pub struct Position<'a> {
    pub handler: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    /// The stored `next_offset` before this transaction (`None`: no row yet).
    pub expected: Option<i64>,
}

/// `None` if every claim the transaction applied still says `done` and the
/// partition's offset row is still `expected`; otherwise what is wrong.
pub async fn violation(
    tx: &mut Tx,
    position: &Position<'_>,
    applied: &[String],
) -> Result<Option<String>, DbError> {
    let mut params: Vec<SqlValue> = vec![
        position.handler.into(),
        position.topic.into(),
        position.partition.into(),
    ];
    params.extend(applied.iter().map(|id| SqlValue::from(id.as_str())));
    let rows = tx.query(&check_sql(applied.len()), &params).await?;
    let (intact, offset) = match rows.as_slice() {
        [row] if row.len() == 2 => (&row[0], &row[1]),
        _ => return Ok(Some("the invariant check returned no row".into())),
    };
    let intact = intact.as_i64().unwrap_or(-1);
    if intact != applied.len() as i64 {
        return Ok(Some(format!(
            "an applied event's inbox claim was changed or removed ({intact} of {} intact)",
            applied.len()
        )));
    }
    let expected = position.expected.map_or(SqlValue::Null, SqlValue::Int64);
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

    fn position(expected: Option<i64>) -> Position<'static> {
        Position {
            handler: "h",
            topic: "t",
            partition: 0,
            expected,
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
        let applied = vec!["e1".to_owned()];
        assert_eq!(
            violation(&mut tx, &position(Some(9)), &applied).await.unwrap(),
            None
        );
        assert_eq!(claim_violation(&mut tx, &claim()).await.unwrap(), None);

        tx.execute("UPDATE offsets SET next_offset = 0", &[])
            .await
            .unwrap();
        let found = violation(&mut tx, &position(Some(9)), &applied)
            .await
            .unwrap()
            .unwrap();
        assert!(found.contains("stored offset was changed"), "{found}");

        tx.execute("DELETE FROM inbox", &[]).await.unwrap();
        let found = violation(&mut tx, &position(Some(0)), &applied)
            .await
            .unwrap()
            .unwrap();
        assert!(found.contains("claim was changed or removed"), "{found}");
        assert!(found.contains("0 of 1 intact"), "{found}");
        assert!(claim_violation(&mut tx, &claim()).await.unwrap().is_some());
    }
}
