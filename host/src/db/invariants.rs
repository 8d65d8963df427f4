//! The host's last check before committing a guest's work: its own rows for
//! this event are exactly as it left them. The walls should make this
//! impossible to fail; if it ever does, the transaction is rolled back and the
//! event parked as a sandbox violation instead of committing a broken promise.

use super::inbox::Claim;
use super::offsets::Advance;
use super::{Backend, DbError, PgArray, SqlValue, Tx};

/// Claims checked per statement, at most.
const CHECK_CHUNK: usize = 128;

/// SQLite: one statement that counts how many of `claims` claims say
/// `done`, a scalar subquery per event id, each an equality lookup on the
/// primary key. (An `IN (...)` list is one statement too, but with stale
/// statistics PostgreSQL's planner filtered every row of the handler through
/// it instead of probing the index: 14 ms per batch at 45,000 rows and
/// growing.) The count is padded to a power of two, so a few statement texts
/// cover every batch size and stay in the statement cache; the padding is
/// NULL, which matches nothing. Each lookup takes the handler and the id as
/// anonymous parameters (see [`anonymous_rows`](super::anonymous_rows)).
fn claims_sql(claims: usize) -> String {
    let lookup = "(SELECT COUNT(*) FROM inbox WHERE handler = ? AND event_id = ? AND status = 'done')";
    format!("SELECT {}", vec![lookup; claims].join(" + "))
}

const OFFSET_SQL: &str =
    "SELECT next_offset FROM offsets WHERE handler = $1 AND topic = $2 AND partition = $3";

/// PostgreSQL: the claims and the offset in one call of the
/// `inboxd_gate.check_batch_rows` gate, whatever the batch's size. The ids
/// and their days come as two arrays, so the text never changes and stays
/// prepared. Each id is probed through a `LATERAL ... LIMIT 1` subquery, which
/// the planner cannot turn into a join that scans the handler's rows (see
/// [`claims_sql`]), with its `id_day`, so only its own partition's primary
/// key is probed, however many daily partitions there are. Measured against
/// the scalar subqueries, 64 ids: about 1 ms instead of 3-17 ms (psql, this
/// machine, 50,000 inbox rows).
const CHECK_SQL_POSTGRES: &str = "SELECT * FROM inboxd_gate.check_batch_rows($1, $2, $3, $4::pg_catalog.int4, \
     $5::pg_catalog.text[], $6::pg_catalog.int8[])";

/// The partition a batch advances, as the host last saw it.
pub struct Position<'a> {
    pub handler: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    /// The stored `next_offset` before this transaction (`None`: no row yet).
    pub expected: Option<i64>,
}

impl<'a> From<&Advance<'a>> for Position<'a> {
    /// The partition an advance moves, as it expects to find it.
    fn from(advance: &Advance<'a>) -> Self {
        Position {
            handler: advance.handler,
            topic: advance.topic,
            partition: advance.partition,
            expected: advance.expected,
        }
    }
}

/// `None` if every claim the transaction applied still says `done` and the
/// partition's offset row is still `expected`; otherwise what is wrong.
pub async fn violation(
    tx: &mut Tx,
    position: &Position<'_>,
    applied: &[String],
) -> Result<Option<String>, DbError> {
    check(tx, position, applied, true).await
}

/// As [`violation`], for a batch with key order, whose partition's offset
/// is moved outside it (see `kafka::keyed`): only the claims are checked.
pub async fn claims_violation(
    tx: &mut Tx,
    handler: &str,
    applied: &[String],
) -> Result<Option<String>, DbError> {
    let position = Position {
        handler,
        topic: "",
        partition: -1,
        expected: None,
    };
    check(tx, &position, applied, false).await
}

async fn check(
    tx: &mut Tx,
    position: &Position<'_>,
    applied: &[String],
    offset: bool,
) -> Result<Option<String>, DbError> {
    if tx.backend() == Backend::Postgres {
        let found = violation_postgres(tx, position, applied).await?;
        return Ok(found.filter(|(claims, _)| *claims || offset).map(|(_, v)| v));
    }
    for chunk in applied.chunks(CHECK_CHUNK) {
        let padded = chunk.len().next_power_of_two();
        // `event_id = NULL` matches nothing: padding never counts.
        let ids = chunk.iter().map(|id| SqlValue::from(id.as_str()));
        let ids = ids.chain(std::iter::repeat(SqlValue::Null)).take(padded);
        let params: Vec<SqlValue> = ids.flat_map(|id| [position.handler.into(), id]).collect();
        let rows = tx.query(&claims_sql(padded), &params).await?;
        let intact = rows.first().and_then(|r| r.first()).and_then(SqlValue::as_i64);
        if intact != Some(chunk.len() as i64) {
            let intact = intact.unwrap_or(0);
            return Ok(Some(format!(
                "an applied event's inbox claim was changed or removed ({intact} of {} intact)",
                chunk.len()
            )));
        }
    }
    if !offset {
        return Ok(None);
    }
    let params = [
        position.handler.into(),
        position.topic.into(),
        position.partition.into(),
    ];
    let rows = tx.query(OFFSET_SQL, &params).await?;
    let offset = rows
        .first()
        .and_then(|r| r.first())
        .cloned()
        .unwrap_or(SqlValue::Null);
    Ok(offset_moved(position, offset))
}

/// [`violation`] on PostgreSQL: one round trip ([`CHECK_SQL_POSTGRES`]).
/// The flag says whether the violation is of the claims (else of the offset).
async fn violation_postgres(
    tx: &mut Tx,
    position: &Position<'_>,
    applied: &[String],
) -> Result<Option<(bool, String)>, DbError> {
    let ids: Vec<&str> = applied.iter().map(String::as_str).collect();
    let days: Vec<i64> = applied
        .iter()
        .map(|id| i64::from(crate::event_id::id_day(id)))
        .collect();
    let params = [
        position.handler.into(),
        position.topic.into(),
        position.partition.into(),
    ];
    let arrays = [PgArray::Texts(ids), PgArray::Ints(days)];
    let row = tx
        .gate_arrays(CHECK_SQL_POSTGRES, &params, &arrays)
        .await?
        .into_iter()
        .next();
    let mut row = row.unwrap_or_default().into_iter();
    let intact = row.next().and_then(|v| v.as_i64()).unwrap_or(0);
    if intact != applied.len() as i64 {
        return Ok(Some((true, claims_changed(intact, applied.len()))));
    }
    Ok(offset_moved(position, row.next().unwrap_or(SqlValue::Null)).map(|v| (false, v)))
}

/// The violation of `applied` claims of which only `intact` still say `done`.
pub(super) fn claims_changed(intact: i64, applied: usize) -> String {
    format!("an applied event's inbox claim was changed or removed ({intact} of {applied} intact)")
}

/// The violation of a partition's offset found at `offset`, if it is not
/// the one `position` expects.
pub(super) fn offset_moved(position: &Position<'_>, offset: SqlValue) -> Option<String> {
    let expected = position.expected.map_or(SqlValue::Null, SqlValue::Int64);
    (offset != expected).then(|| {
        format!("the partition's stored offset was changed (expected {expected:?}, found {offset:?})")
    })
}

/// As [`violation`], for a replay, which does not move the partition's offset
/// (and may run while a consumer does): only the claim row is checked.
pub async fn claim_violation(tx: &mut Tx, claim: &Claim<'_>) -> Result<Option<String>, DbError> {
    let status = super::inbox::status(tx, claim.handler, claim.event_id).await?;
    let status = status.as_deref();
    Ok((status != Some("done"))
        .then(|| format!("the event's inbox claim was changed or removed (status {status:?})")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::inbox;
    use crate::db::offsets::{self, Advance};
    use crate::db::test_support::each_backend;

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
        for db in each_backend().await {
            let on = db.backend();
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
                None,
                "{on:?}"
            );
            assert_eq!(claim_violation(&mut tx, &claim()).await.unwrap(), None);

            tx.execute("UPDATE offsets SET next_offset = 0", &[])
                .await
                .unwrap();
            let found = violation(&mut tx, &position(Some(9)), &applied)
                .await
                .unwrap()
                .unwrap();
            assert!(found.contains("stored offset was changed"), "{on:?}: {found}");

            tx.execute("UPDATE inbox SET status = 'dead'", &[]).await.unwrap();
            let found = violation(&mut tx, &position(Some(0)), &applied)
                .await
                .unwrap()
                .unwrap();
            assert!(found.contains("0 of 1 intact"), "{on:?}: {found}");
            tx.execute("DELETE FROM inbox", &[]).await.unwrap();
            let found = violation(&mut tx, &position(Some(0)), &applied)
                .await
                .unwrap()
                .unwrap();
            assert!(found.contains("claim was changed or removed"), "{on:?}: {found}");
            assert!(found.contains("0 of 1 intact"), "{on:?}: {found}");
            assert!(claim_violation(&mut tx, &claim()).await.unwrap().is_some());
        }
    }

    #[tokio::test]
    async fn one_missing_claim_among_many_is_counted_exactly() {
        for db in each_backend().await {
            let on = db.backend();
            let mut tx = db.begin().await.unwrap();
            // 130 claims: on SQLite two statements (128 + 2, padded to 2), on
            // PostgreSQL one. Ids with JSON's special characters travel intact.
            let ids: Vec<String> = (0..130).map(|i| format!("e{i}\"\\\u{e9}")).collect();
            for id in &ids {
                let claim = Claim {
                    event_id: id,
                    ..claim()
                };
                inbox::claim(&mut tx, &claim).await.unwrap();
            }
            assert_eq!(
                violation(&mut tx, &position(None), &ids).await.unwrap(),
                None,
                "{on:?}"
            );
            tx.execute("DELETE FROM inbox WHERE event_id = $1", &[ids[5].as_str().into()])
                .await
                .unwrap();
            let found = violation(&mut tx, &position(None), &ids).await.unwrap().unwrap();
            let expected = match on {
                crate::db::Backend::Sqlite => "127 of 128 intact",
                crate::db::Backend::Postgres => "129 of 130 intact",
            };
            assert!(found.contains(expected), "{on:?}: {found}");
        }
    }
}
