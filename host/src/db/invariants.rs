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
