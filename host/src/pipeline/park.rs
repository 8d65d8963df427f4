//! Parking: an event that cannot succeed ends as a dead letter with its
//! reason, in the transaction that claimed it or in one of its own, so every
//! record ends applied once or parked.

use super::{Fence, Outcome, Pipeline, PipelineError};
use crate::db::dead_letters::{self, DeadLetter, ReasonKind};
use crate::db::inbox::{self, Claim};
use crate::db::{Tx, now_ms};
use crate::record::Record;
use crate::stats::Stats;

/// Why and how an event is parked.
pub(super) struct Park {
    pub(super) kind: ReasonKind,
    pub(super) reason: String,
    pub(super) attempts: u32,
    pub(super) first_failed_at: i64,
}

impl Park {
    /// An event whose payload is past its handler's limit: parked unrun.
    /// A record past its handler's payload limit: `cut` if the host could
    /// not keep it whole (then its letter can never be replayed).
    pub(super) fn too_large(reason: String, record: &Record) -> Self {
        Park {
            kind: if record.cut.is_some() {
                ReasonKind::Cut
            } else {
                ReasonKind::Limit
            },
            reason,
            attempts: 0,
            first_failed_at: now_ms(),
        }
    }
}

impl Pipeline {
    /// Parks a claimed event in `tx`: the inbox row says `dead` (so a replayed
    /// copy is not run again by accident) and the dead letter says why.
    pub(super) async fn park_claimed(
        &self,
        tx: &mut Tx,
        claim: &Claim<'_>,
        record: &Record,
        park: Park,
    ) -> Result<Parked, PipelineError> {
        inbox::mark_dead(tx, claim).await?;
        // A parked event holds no business key: a later event with its key
        // is applied, and a replay of this one claims the key afresh.
        self.release_business_key(tx, record, claim.event_id).await?;
        let letter = DeadLetter {
            event_id: Some(claim.event_id),
            kind: park.kind,
            reason: &park.reason,
            attempts: park.attempts,
            handler_version: Some(self.handler.version_label()),
            first_failed_at: park.first_failed_at,
            ..self.letter(record)
        };
        dead_letters::insert(tx, &letter).await?;
        Ok(Parked::new(&letter))
    }

    /// Parks an event in a transaction of its own, after the one that
    /// claimed it was rolled back: it claims the event again first, and if
    /// another copy of it (another partition's, say) applied or parked it
    /// meanwhile, this one is the duplicate it now is and nothing is parked.
    /// (Marking it `dead` over the other's `done` would let a replay apply it
    /// twice.)
    pub(super) async fn park_alone(
        &self,
        claim: &Claim<'_>,
        record: &Record,
        fence: Fence,
        park: Park,
    ) -> Result<Outcome, PipelineError> {
        let mut tx = self.db.begin_guest(self.handler.name()).await?;
        if !inbox::claim(&mut tx, claim).await? {
            if !self.finish(tx, record, fence, 1).await? {
                return Ok(Outcome::Fenced);
            }
            self.stats.duplicates(1);
            tracing::info!(
                handler = claim.handler,
                event_id = claim.event_id,
                "another copy of the event was applied or parked while this one failed: skipped as a duplicate"
            );
            return Ok(Outcome::Duplicate);
        }
        let letter = self.park_claimed(&mut tx, claim, record, park).await?;
        self.commit_parked(tx, record, fence, letter).await
    }

    /// A record without a usable event id can never be deduplicated, so it is
    /// never run: it is parked in `tx` with the reason and the partition moves on.
    pub(super) async fn park_without_id(
        &self,
        tx: &mut Tx,
        record: &Record,
        reason: &str,
    ) -> Result<Parked, PipelineError> {
        let letter = DeadLetter {
            kind: ReasonKind::EventId,
            reason,
            attempts: 0,
            ..self.letter(record)
        };
        dead_letters::insert(tx, &letter).await?;
        Ok(Parked::new(&letter))
    }

    /// Moves the offset past a record parked alone in `tx` and commits.
    pub(super) async fn commit_parked(
        &self,
        tx: Tx,
        record: &Record,
        fence: Fence,
        parked: Parked,
    ) -> Result<Outcome, PipelineError> {
        if !self.finish(tx, record, fence, 1).await? {
            return Ok(Outcome::Fenced);
        }
        parked.report(self.handler.name(), &self.stats);
        Ok(Outcome::DeadLettered)
    }

    pub(super) fn letter<'a>(&'a self, record: &'a Record) -> DeadLetter<'a> {
        DeadLetter {
            handler: self.handler.name(),
            event_id: None,
            topic: &record.topic,
            partition: record.partition,
            offset: record.offset,
            key: record.key.as_deref(),
            payload: &record.payload,
            headers: &record.headers,
            kind: ReasonKind::EventId,
            reason: "",
            attempts: 0,
            handler_version: None,
            first_failed_at: now_ms(),
            record_bytes: record.cut.map(|cut| cut.record_bytes()),
        }
    }
}

/// A dead letter written in a transaction, reported once that commits.
pub(super) struct Parked {
    pub(super) event_id: Option<String>,
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) kind: ReasonKind,
    pub(super) attempts: u32,
    pub(super) reason: String,
}

impl Parked {
    pub(super) fn new(letter: &DeadLetter<'_>) -> Self {
        Self {
            event_id: letter.event_id.map(str::to_owned),
            topic: letter.topic.to_owned(),
            partition: letter.partition,
            offset: letter.offset,
            kind: letter.kind,
            attempts: letter.attempts,
            reason: letter.reason.to_owned(),
        }
    }

    pub(super) fn report(&self, handler: &str, stats: &Stats) {
        stats.dead_lettered();
        tracing::warn!(
            handler,
            event_id = self.event_id,
            topic = self.topic,
            partition = self.partition,
            offset = self.offset,
            kind = self.kind.as_str(),
            attempts = self.attempts,
            "dead-lettered: {}",
            self.reason
        );
    }
}
