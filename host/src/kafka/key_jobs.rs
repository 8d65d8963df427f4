//! What a key-order partition ([`super::keyed`]) runs for one key outside
//! its batches: a record run again alone once its retry's backoff is over,
//! and the records of a blocked key held behind its dead letter. Each waits
//! out an outage of the host's own and ends when the partition stops.

use super::outage::{Attempt, OutageLog};
use crate::db::dead_letters::ReasonKind;
use crate::metrics::HostErrorKind;
use crate::pipeline::{Deferred, Fence, HOST_ERROR_ATTEMPTS, Held, Outcome, Pipeline, PipelineError};
use crate::record::Record;
use tokio_util::sync::CancellationToken;

/// Runs a record again alone once its backoff is over, retrying the host's
/// own failures; `None` if `stop` came first (nothing committed).
pub(super) async fn retry_alone(
    pipeline: &Pipeline,
    outage: &OutageLog,
    record: &Record,
    deferred: Deferred,
    stop: &CancellationToken,
) -> Option<Outcome> {
    tokio::select! {
        _ = stop.cancelled() => return None,
        _ = tokio::time::sleep_until(deferred.due.into()) => {}
    }
    let mut attempt = Attempt::new(outage);
    loop {
        let run = pipeline.process_alone(
            record,
            Fence::Keyed,
            stop,
            deferred.attempt,
            Some(deferred.first_failed_at),
        );
        match run.await {
            Ok(outcome) => {
                attempt.succeeded("processing records");
                return Some(outcome);
            }
            Err(PipelineError::Abandoned) => return None,
            Err(error) => {
                if error.is_transient() {
                    pipeline.stats().host_error(HostErrorKind::Transient);
                }
                if !attempt.failed("processing records", &error, stop).await {
                    return None;
                }
            }
        }
    }
}

/// Holds records of a blocked key ([`Pipeline::hold`]), waiting out an
/// outage; a failure that is not one (a row the database refuses for good)
/// parks them (kind `held`, with the reason) after [`HOST_ERROR_ATTEMPTS`] tries,
/// so the partition is not pinned. `None` if `stop` came first.
pub(super) async fn hold_or_park(
    pipeline: &Pipeline,
    outage: &OutageLog,
    key: &[u8],
    records: &[Record],
    max_held: u64,
    stop: &CancellationToken,
) -> Option<Held> {
    const WHAT: &str = "holding records behind a dead letter";
    let mut attempt = Attempt::new(outage);
    let mut refused = 0;
    let first_failed_at = crate::db::now_ms();
    loop {
        let error = match pipeline.hold(key, records, max_held).await {
            Ok(held) => {
                attempt.succeeded(WHAT);
                return Some(held);
            }
            Err(PipelineError::Abandoned) => return None,
            Err(error) => error,
        };
        if !error.is_transient() {
            refused += 1;
            pipeline.stats().host_error(HostErrorKind::Permanent);
            if refused >= HOST_ERROR_ATTEMPTS {
                for record in records {
                    let parked = outage
                        .retry(WHAT, stop, || {
                            pipeline.park_host_error(
                                record,
                                Fence::Keyed,
                                &error,
                                refused,
                                first_failed_at,
                                ReasonKind::Held,
                            )
                        })
                        .await;
                    parked?;
                }
                return Some(Held::Parked {
                    behind: 0,
                    count: records.len(),
                });
            }
        }
        if !attempt.failed(WHAT, &error, stop).await {
            return None;
        }
    }
}
