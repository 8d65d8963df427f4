//! Held records (`ordering = "key"`): a record whose key has a parked
//! letter is never run. It is parked too, as `held` behind the first such
//! letter, so its key's order survives: replaying that letter replays the
//! held ones after it, in offset order (see `replay::release_held`).

use super::{Park, Parked, Pipeline, PipelineError};
use crate::db::dead_letters::{self, KeyAt, ReasonKind};
use crate::db::{inbox, now_ms};
use crate::event_id;
use crate::record::Record;

/// What became of records of a blocked key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Nothing blocks the key any more (its letters were replayed or
    /// discarded): the records are to be run. Nothing was written.
    Released,
    /// The first `count` records parked (or skipped as duplicates) behind
    /// dead letter `behind`; the rest, if any, would have passed the
    /// handler's `max_held_records` and were not touched.
    Parked { behind: i64, count: usize },
    /// Not parked: the handler already holds `held` records, its
    /// `max_held_records`. Nothing was written.
    Full { held: i64 },
}

impl Pipeline {
    /// Parks `records` (all of Kafka key `key`, in offset order) as held
    /// behind the key's first parked letter, in one transaction of the
    /// host's own (no handler runs), as many as the handler's `max_held`
    /// leaves room for; or, if none blocks the key now, does nothing. The
    /// check and the parking share the transaction, so a replay that
    /// resolves the last letter meanwhile is seen either way.
    pub async fn hold(&self, key: &[u8], records: &[Record], max_held: u64) -> Result<Held, PipelineError> {
        let handler = self.handler.name();
        let Some(first) = records.first() else {
            return Ok(Held::Parked { behind: 0, count: 0 });
        };
        let at = KeyAt {
            handler,
            topic: &first.topic,
            partition: first.partition,
            key,
        };
        let mut tx = self.db.begin_immediate().await?;
        // Their claims first, before the lock below: a replay of one of them
        // (a redelivery of a record already held) claims it and then
        // resolves its letter, so taking the lock first and the claim second
        // would wait on each other in opposite orders.
        let mut claimed: Vec<(&Record, Option<String>)> = Vec::with_capacity(records.len());
        for record in records {
            match event_id::of(&self.event_id, record) {
                Ok(id) => {
                    // Applied or parked before (a redelivery after a crash): nothing to hold.
                    if inbox::claim(&mut tx, &self.claim(record, &id)).await? {
                        claimed.push((record, Some(id)));
                    } else {
                        self.stats.duplicates(1);
                    }
                }
                Err(_) => claimed.push((record, None)),
            }
        }
        // The letter they go behind stays unresolved until this commits (on
        // PostgreSQL it is locked; SQLite has one writer): a replay that
        // resolves it meanwhile waits, then finds these held behind it.
        let behind = loop {
            if let Some((id, _)) = dead_letters::first_blocking(&mut tx, &at, true).await? {
                break id;
            }
            // None blocks the key, or the one that did was resolved while
            // the lock waited: only a look without the lock tells which.
            if dead_letters::first_blocking(&mut tx, &at, false).await?.is_none() {
                tx.rollback().await?;
                return Ok(Held::Released);
            }
        };
        let held = dead_letters::held_count(&mut tx, handler).await?;
        let room = usize::try_from(max_held.saturating_sub(held as u64)).unwrap_or(usize::MAX);
        // The records up to the last one that fits (duplicates take no room).
        let fits = claimed.len().min(room);
        let count = match claimed.get(fits) {
            Some((first_left, _)) => records
                .iter()
                .position(|r| r.offset == first_left.offset)
                .unwrap_or(0),
            None => records.len(),
        };
        if count == 0 {
            tx.rollback().await?;
            return Ok(Held::Full { held });
        }
        for (_, id) in &claimed[fits..] {
            if let Some(id) = id {
                inbox::unclaim(&mut tx, handler, id).await?;
            }
        }
        let reason = format!("held behind dead letter {behind}");
        let mut parked: Vec<Parked> = Vec::with_capacity(fits);
        for (record, id) in &claimed[..fits] {
            let Some(id) = id else {
                let error = event_id::of(&self.event_id, record)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                parked.push(self.park_without_id(&mut tx, record, &error).await?);
                continue;
            };
            // A record the host could not keep whole is never run, held or
            // not: a `held` letter is replayed when the one before it is
            // resolved (by a host from before `cut` too), so it is parked as
            // `cut` instead, and blocks its key itself (the nineteenth read).
            let park = match record.cut {
                Some(cut) => Park {
                    kind: ReasonKind::Cut,
                    reason: format!("{} ({reason})", cut.reason()),
                    attempts: 0,
                    first_failed_at: now_ms(),
                },
                None => Park {
                    kind: ReasonKind::Held,
                    reason: reason.clone(),
                    attempts: 0,
                    first_failed_at: now_ms(),
                },
            };
            parked.push(
                self.park_claimed(&mut tx, &self.claim(record, id), record, park)
                    .await?,
            );
        }
        tx.commit().await?;
        for letter in parked {
            letter.report(handler, &self.stats);
        }
        Ok(Held::Parked { behind, count })
    }
}
