//! Replaying a dead letter: the operator's explicit "try this event again".
//!
//! A replay runs the parked event through the handler with a fresh claim, in
//! one transaction: the inbox row that says `dead` is deleted and re-claimed,
//! the handler runs, and the dead letter is marked `replayed`. Two replays of
//! one dead letter at once are safe: the second's claim meets the first's
//! (the database serialises the two on the inbox key) and it reports that the
//! event was already applied. The partition's offset is not touched: the record was
//! passed long ago.

use crate::business_key;
use crate::config::DedupConfig;
use crate::db::dead_letters::{self, ReasonKind, Row};
use crate::db::inbox::{self, Claim};
use crate::db::{Database, business_keys};
use crate::handler::Handler;
use crate::pipeline::PipelineError;
use crate::pipeline::guest::{self, Call, Called};
use crate::pipeline::tail::{self, End, Sealed};
use crate::record::Record;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "kebab-case")]
pub enum ReplayOutcome {
    /// The handler ran and committed; the dead letter is marked `replayed`.
    Replayed,
    /// Another replay (or a redelivery after a discard) applied it first.
    AlreadyApplied,
    /// The dead letter was already replayed or discarded.
    AlreadyResolved(String),
    /// It has no event id, so it cannot be deduplicated and is never run.
    NoEventId,
    /// The handler failed again; the dead letter stays, with the new reason.
    Failed(String),
    /// Not run: another event with its business key (`[handlers.dedup]`)
    /// was applied inside the window meanwhile. The dead letter is marked
    /// `replayed` (its effect is there) and its event id claimed.
    DuplicateByKey,
    /// Held behind a dead letter of its key (`ordering = "key"`) and
    /// discarded with it, as the operator chose; not run.
    Discarded,
    /// Not run: it is held behind this earlier dead letter of its key,
    /// which is to be replayed or discarded first (its key keeps its order).
    HeldBehind(i64),
}

impl ReplayOutcome {
    /// Whether this call resolved the letter (then the records held behind
    /// it may go; another call that resolved it releases them itself).
    pub fn resolved_here(&self) -> bool {
        matches!(
            self,
            ReplayOutcome::Replayed | ReplayOutcome::DuplicateByKey | ReplayOutcome::Discarded
        )
    }
}

/// What becomes of the letters held behind one that is resolved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HeldChoice {
    /// Replayed after it, in offset order, up to the first that fails.
    #[default]
    Replay,
    /// Discarded with it.
    Discard,
}

/// Rounds of looking for held letters at most, [`HELD_CHUNK`] letters
/// each: more than the default `max_held_records` (100,000), and a bound on
/// one call while the partition holds records of the key as fast as they
/// are released.
const RELEASE_ROUNDS: usize = 200_000;

/// Held letters read at a time, records included: one, since a record's
/// headers have no bound on their count (a letter of a megabyte of empty
/// headers is some 24 MB once read), and each is replayed in a transaction
/// of its own anyway.
const HELD_CHUNK: i64 = 1;

/// Releases the letters held behind `letter` (resolved just now), in offset
/// order, each with its outcome: replayed (stopping at the first that is not
/// resolved, so its key keeps its order) or discarded. Records of the key
/// that the partition holds meanwhile are released too.
pub async fn release_held(
    db: &Database,
    handler: &dyn Handler,
    dedup: Option<&DedupConfig>,
    letter: &Row,
    choice: HeldChoice,
) -> Result<Vec<(i64, ReplayOutcome)>, PipelineError> {
    let mut released = Vec::new();
    let (mut rounds, mut last_first) = (0, None);
    while rounds < RELEASE_ROUNDS {
        let held = dead_letters::held_behind(db, letter, HELD_CHUNK).await?;
        // Every letter of a chunk was resolved (or this returned), so each
        // read makes progress; the same first letter twice would mean none.
        if held.is_empty() || last_first == Some(held[0].id) {
            break;
        }
        last_first = Some(held[0].id);
        rounds += 1;
        for row in &held {
            let outcome = match choice {
                HeldChoice::Replay => replay(db, handler, dedup, row).await?,
                HeldChoice::Discard => match held_behind_another(db, row).await? {
                    Some(first) => ReplayOutcome::HeldBehind(first),
                    None => {
                        let mut tx = db.begin_write().await?;
                        let discarded = dead_letters::resolve(&mut tx, row.id, "discarded").await?;
                        tx.commit().await?;
                        if discarded {
                            ReplayOutcome::Discarded
                        } else {
                            ReplayOutcome::AlreadyResolved("resolved".into())
                        }
                    }
                },
            };
            let stop = !outcome.resolved_here();
            released.push((row.id, outcome));
            if stop {
                return Ok(released);
            }
        }
    }
    Ok(released)
}

/// For a held letter, the earlier letter of its key it still waits behind.
async fn held_behind_another(db: &Database, letter: &Row) -> Result<Option<i64>, PipelineError> {
    let (ReasonKind::Held, Some(key)) = (letter.kind, &letter.key) else {
        return Ok(None);
    };
    let at = dead_letters::KeyAt {
        handler: &letter.handler,
        topic: &letter.topic,
        partition: letter.partition,
        key,
    };
    let mut tx = db.begin().await?;
    let first = dead_letters::first_blocking(&mut tx, &at, false).await?;
    tx.rollback().await?;
    Ok(first
        .filter(|(_, offset)| *offset < letter.offset)
        .map(|(id, _)| id))
}

/// Runs a dead letter again. `Err` is the host's failure (the database, a
/// call abandoned mid-statement): nothing changed and it may be tried again.
pub async fn replay(
    db: &Database,
    handler: &dyn Handler,
    dedup: Option<&DedupConfig>,
    letter: &Row,
) -> Result<ReplayOutcome, PipelineError> {
    if let Some(resolution) = &letter.resolution {
        return Ok(ReplayOutcome::AlreadyResolved(resolution.clone()));
    }
    let Some(event_id) = letter.event_id.as_deref() else {
        return Ok(ReplayOutcome::NoEventId);
    };
    if let Some(bytes) = letter.record_bytes {
        // Running the part kept would run an event that never was.
        return Ok(ReplayOutcome::Failed(format!(
            "the letter keeps only the first part of its record ({bytes} bytes as consumed, past \
             limits.max_payload_bytes), so it cannot be replayed: discard it, and read the record from \
             Kafka at its offset"
        )));
    }
    if let Some(first) = held_behind_another(db, letter).await? {
        return Ok(ReplayOutcome::HeldBehind(first));
    }
    let record = Record {
        topic: letter.topic.clone(),
        partition: letter.partition,
        offset: letter.offset,
        key: letter.key.clone(),
        payload: letter.payload.clone(),
        headers: letter.headers.clone(),
        timestamp_ms: None,
        cut: None,
    };
    let claim = Claim {
        handler: handler.name(),
        event_id,
        topic: &record.topic,
        partition: record.partition,
        offset: record.offset,
        handler_version: handler.version_label(),
    };
    // The writer, as the pipeline takes it: on SQLite a replay queues with
    // the pipeline's batches instead of failing on a locked database.
    // (On PostgreSQL, a session of the handler's own: see `db::begin_guest`.)
    let mut tx = db.begin_guest(claim.handler).await?;
    // The dead claim is deleted and the event claimed afresh; the new claim
    // is the replay's lock: of two replays at once, the second finds the
    // first's. (A `host-error` letter may have no inbox row to delete, when
    // the row was what the database refused: then the claim alone.)
    inbox::release_dead(&mut tx, claim.handler, event_id).await?;
    if !inbox::claim(&mut tx, &claim).await? {
        tx.rollback().await?;
        return Ok(ReplayOutcome::AlreadyApplied);
    }
    let end = End::Resolve {
        letter: letter.id,
        claim: &claim,
    };
    // As in the pipeline: the business key first, and the handler only if
    // no other applied event holds it.
    let key = dedup.and_then(|d| Some((business_key::extract(d, &record.headers, &record.payload)?, d)));
    if let Some((key, dedup)) = &key
        && !business_keys::claim_many(&mut tx, claim.handler, &[(key.as_str(), event_id)], dedup.window)
            .await?
            .contains(event_id)
    {
        return match tail::seal(tx, claim.handler, &[], &[], end).await? {
            Sealed::Committed => Ok(ReplayOutcome::DuplicateByKey),
            Sealed::Raced => Ok(ReplayOutcome::AlreadyApplied),
            Sealed::Violation(violation) => {
                let reason = format!("sandbox violation: {violation}");
                dead_letters::record_failure(db, letter.id, &reason).await?;
                Ok(ReplayOutcome::Failed(reason))
            }
        };
    }
    let attempt = u32::try_from(letter.attempts + 1).unwrap_or(u32::MAX);
    let Called { tx, call, .. } =
        guest::call(handler, tx, &record, event_id, attempt, std::time::Duration::ZERO).await?;
    let reason = match call {
        Call::Applied(messages) => {
            let applied = [event_id.to_owned()];
            match tail::seal(tx, claim.handler, &applied, &messages, end).await? {
                Sealed::Committed => return Ok(ReplayOutcome::Replayed),
                Sealed::Raced => return Ok(ReplayOutcome::AlreadyApplied),
                Sealed::Violation(violation) => format!("sandbox violation: {violation}"),
            }
        }
        Call::Failed(failure) => {
            tx.rollback().await?;
            failure.to_string()
        }
        Call::TooLarge(reason) => {
            tx.rollback().await?;
            reason
        }
        Call::Redo | Call::DuplicateByKey => {
            unreachable!("a replay's transaction shares no savepoint, and its key was claimed above")
        }
    };
    dead_letters::record_failure(db, letter.id, &reason).await?;
    Ok(ReplayOutcome::Failed(reason))
}
