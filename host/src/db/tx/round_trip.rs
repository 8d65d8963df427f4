//! How long a round trip on a handler's PostgreSQL session may go
//! unanswered before the host gives the connection up (issue 27).

use crate::db::DbError;
use std::time::Duration;

/// What a handler session's host statements may wait for, beyond their own
/// work: a lock, up to the session's `lock_timeout`. A round trip still
/// unanswered after that (plus a guest statement's own `statement_timeout`
/// while a call's walls are up) means the server or the network is gone:
/// a blackholed connection otherwise waits for TCP's own timeout, many
/// minutes, with its partition silent (issue 27's fault proxy).
pub(super) const ROUND_TRIP_GRACE: Duration = Duration::from_secs(5);

/// A handler session's bound on one host round trip (see [`ROUND_TRIP_GRACE`]).
pub(in crate::db) const HANDLER_ROUND_TRIP: Duration =
    Duration::from_secs(crate::db::logins::HOST_LOCK_TIMEOUT.as_secs() + ROUND_TRIP_GRACE.as_secs());

/// PostgreSQL's answer to `work`, or [`DbError::NoAnswer`] after `within`.
pub(super) async fn answered<T, E: Into<DbError>>(
    within: Option<Duration>,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, DbError> {
    let Some(limit) = within else {
        return work.await.map_err(Into::into);
    };
    match tokio::time::timeout(limit, work).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(DbError::NoAnswer { waited: limit }),
    }
}
