//! Host errors end: an event whose own transaction the database keeps
//! refusing is parked, so one row the host cannot write never wedges its
//! partition.
//!
//! A transient failure (see [`DbError::is_transient`]) is an outage: every
//! event waits it out, and the caller retries with backoff until the database
//! is back. Any other failure of the host's own statements (a constraint an
//! operator added, a row the host cannot read, a defect of the host) will
//! come back on every retry. A batch that meets one runs its records one at a
//! time ([`Pipeline::process`]), so the failure reaches its own event; that
//! event is tried [`HOST_ERROR_ATTEMPTS`] times, with the handler's retry
//! backoff between, and then parked as
//! `host-error` with the database's message, its partition moving on.

use super::{Fence, Outcome, Park, Pipeline, PipelineError, backoff};
use crate::db::dead_letters::{self, DeadLetter, ReasonKind};
use crate::db::now_ms;
use crate::event_id;
use crate::metrics::HostErrorKind;
use crate::record::Record;
use tokio_util::sync::CancellationToken;

/// Runs of one event's transaction that a permanent host error may fail
/// before the event is parked. More than one, so an error the classification
/// calls permanent but that was a passing race does not park an event.
pub const HOST_ERROR_ATTEMPTS: u32 = 3;

impl PipelineError {
    /// True for a failure that is not the event's: the caller waits it out.
    pub fn is_transient(&self) -> bool {
        match self {
            PipelineError::Database(error) => error.is_transient(),
            // A guest call that did not hand its transaction back is a defect
            // of the host that the same event will meet again.
            PipelineError::LostTransaction => false,
            PipelineError::Abandoned => true,
        }
    }
}

impl Pipeline {
    /// Processes one record in a transaction of its own, to its end: applied,
    /// duplicate, or dead-lettered. `expected` is the partition's stored next
    /// offset as the caller last saw it (`None`: no row yet). Handler failures
    /// are retried here (the partition waits); on shutdown a pending retry is
    /// abandoned uncommitted. A transient host error is returned for the
    /// caller to wait out; a permanent one parks the event as `host-error`
    /// after [`HOST_ERROR_ATTEMPTS`] runs.
    pub async fn process(
        &self,
        record: &Record,
        expected: Option<i64>,
        shutdown: &CancellationToken,
    ) -> Result<Outcome, PipelineError> {
        self.process_alone(record, Fence::Partition(expected), shutdown, 1, None)
            .await
    }

    /// As [`Pipeline::process`], the handler's attempts starting at
    /// `handler_attempt` (a batch already ran the earlier ones).
    pub async fn process_alone(
        &self,
        record: &Record,
        fence: Fence,
        shutdown: &CancellationToken,
        handler_attempt: u32,
        handler_failed_at: Option<i64>,
    ) -> Result<Outcome, PipelineError> {
        let first_failed_at = now_ms();
        let mut attempt = 1;
        loop {
            let run = self.process_from(record, fence, shutdown, handler_attempt, handler_failed_at);
            let error = match run.await {
                Err(error) if !error.is_transient() => error,
                other => return other,
            };
            self.stats.host_error(HostErrorKind::Permanent);
            if attempt >= HOST_ERROR_ATTEMPTS {
                return self
                    .park_host_error(
                        record,
                        fence,
                        &error,
                        attempt,
                        first_failed_at,
                        ReasonKind::HostError,
                    )
                    .await;
            }
            tracing::warn!(
                handler = self.handler.name(),
                topic = record.topic,
                partition = record.partition,
                offset = record.offset,
                attempt,
                "the database refused this event's transaction ({error}); trying again before parking it"
            );
            tokio::select! {
                _ = shutdown.cancelled() => return Err(PipelineError::Abandoned),
                _ = tokio::time::sleep(backoff(&self.retry, attempt)) => {}
            }
            attempt += 1;
        }
    }

    /// Parks a record whose transaction the database refused, in a new
    /// transaction: with its inbox row marked `dead` where that can be
    /// written, and without one where the inbox row was what failed (a
    /// replay then claims it afresh). If even that is refused the error goes
    /// back to the caller, who retries it as an outage, logged and counted.
    /// `kind`: `host-error`, or `held` for a record of a blocked key whose
    /// holding the database refused (it stays behind its key's letter: a
    /// replay may not run it first, and replaying that letter releases it).
    pub async fn park_host_error(
        &self,
        record: &Record,
        fence: Fence,
        error: &PipelineError,
        attempts: u32,
        first_failed_at: i64,
        kind: ReasonKind,
    ) -> Result<Outcome, PipelineError> {
        let event_id = event_id::of(&self.event_id, record).ok();
        let reason = match kind {
            ReasonKind::Held => format!(
                "held behind a dead letter of its key; the database refused the host's own statements \
                 for it: {error}"
            ),
            _ => format!("the database refused the host's own statements for this event: {error}"),
        };
        let park = || Park {
            kind,
            reason: reason.clone(),
            attempts,
            first_failed_at,
        };
        if let Some(event_id) = &event_id {
            let claim = self.claim(record, event_id);
            match self.park_alone(&claim, record, fence, park()).await {
                Err(error) if !error.is_transient() => {
                    tracing::warn!(
                        handler = self.handler.name(),
                        event_id,
                        "parking the event with its inbox row failed too ({error}); parking it without one"
                    );
                }
                other => return other,
            }
        }
        let park = park();
        let mut tx = self.db.begin_guest(self.handler.name()).await?;
        let letter = DeadLetter {
            event_id: event_id.as_deref(),
            kind: park.kind,
            reason: &park.reason,
            attempts: park.attempts,
            handler_version: Some(self.handler.version_label()),
            first_failed_at: park.first_failed_at,
            ..self.letter(record)
        };
        dead_letters::insert(&mut tx, &letter).await?;
        let parked = super::Parked::new(&letter);
        self.commit_parked(tx, record, fence, parked).await
    }
}
