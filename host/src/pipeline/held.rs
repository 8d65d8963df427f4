//! Held records (`ordering = "key"`): a record whose key has a parked
//! letter is never run. It is parked too, as `held` behind the first such
//! letter, so its key's order survives: replaying that letter replays the
//! held ones after it, in offset order (see `replay::release_held`).

use super::{Park, Parked, Pipeline, PipelineError};
use crate::db::dead_letters::{self, ReasonKind};
use crate::db::{inbox, now_ms};
use crate::event_id;
use crate::record::Record;

/// What became of records of a blocked key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Nothing blocks the key any more (its letters were replayed or
    /// discarded): the records are to be run. Nothing was written.
    Released,
    /// Parked (or skipped as duplicates) behind dead letter `behind`.
    Parked { behind: i64 },
}

impl Pipeline {
    /// Parks `records` (all of Kafka key `key`, in offset order) as held
    /// behind the key's first parked letter, in one transaction of the
    /// host's own (no handler runs); or, if none blocks the key now, does
    /// nothing. The check and the parking share the transaction, so a
    /// replay that resolves the last letter meanwhile is seen either way.
    pub async fn hold(&self, key: &[u8], records: &[Record]) -> Result<Held, PipelineError> {
        let handler = self.handler.name();
        let mut tx = self.db.begin_immediate().await?;
        let Some(behind) = dead_letters::first_blocking(&mut tx, handler, key).await? else {
            tx.rollback().await?;
            return Ok(Held::Released);
        };
        let reason = format!("held behind dead letter {behind}");
        let mut parked: Vec<Parked> = Vec::with_capacity(records.len());
        for record in records {
            let id = match event_id::extract(&self.event_id, &record.headers, &record.payload) {
                Ok(id) => id,
                Err(error) => {
                    parked.push(self.park_without_id(&mut tx, record, &error.to_string()).await?);
                    continue;
                }
            };
            let claim = self.claim(record, &id);
            // Applied or parked before (a redelivery after a crash): nothing to hold.
            if !inbox::claim(&mut tx, &claim).await? {
                self.stats.duplicates(1);
                continue;
            }
            let park = Park {
                kind: ReasonKind::Held,
                reason: reason.clone(),
                attempts: 0,
                first_failed_at: now_ms(),
            };
            parked.push(self.park_claimed(&mut tx, &claim, record, park).await?);
        }
        tx.commit().await?;
        for letter in parked {
            letter.report(handler, &self.stats);
        }
        Ok(Held::Parked { behind })
    }
}
