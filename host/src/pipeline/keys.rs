//! Business keys in a batch (`[handlers.dedup]`): claimed together before
//! any handler runs, then followed record by record.
//!
//! Claiming every key of the batch's new events in one statement, in key
//! order, costs one round trip per batch (not one per event between guest
//! calls, which would take each call's walls down and flush its held-back
//! INSERTs) and makes two batches with overlapping keys lock them in the
//! same order. Within the batch the first event of a key (in offset order)
//! holds it; a later one is a duplicate by key unless the holder is parked
//! first, which frees the key for the next one to claim on its own.

use super::Pipeline;
use crate::business_key;
use crate::db::{DbError, Tx, business_keys};
use crate::record::Record;
use std::collections::HashMap;

/// Who has a key, as far as this batch knows.
enum Holder {
    /// This event of the batch (claimed up front, or after a park freed it).
    Event(String),
    /// An event outside the batch, inside its window.
    Elsewhere,
    /// Its holder in this batch was parked: the next event claims it.
    Free,
}

/// What a record of the batch may do at its turn.
pub(super) enum Turn {
    /// No dedup, or no key: run it.
    Run,
    /// It holds its key: run it; parked or retried, it frees the key.
    RunHolding(String),
    /// Another applied event holds its key: skip it.
    DuplicateByKey,
}

/// The batch's keys and who holds each.
#[derive(Default)]
pub(super) struct BatchKeys {
    holders: HashMap<String, Holder>,
}

impl BatchKeys {
    /// Claims the keys of `fresh` (the new events of the batch: record and
    /// event id, in offset order); the first event of each key claims it.
    pub async fn claim(pipeline: &Pipeline, tx: &mut Tx, fresh: &[(&Record, &str)]) -> Result<Self, DbError> {
        let mut keys = Self::default();
        let Some(dedup) = pipeline.dedup.as_ref() else {
            return Ok(keys);
        };
        let mut first: Vec<(String, &str)> = Vec::new();
        for (record, event_id) in fresh {
            if let Some(key) = business_key::of(dedup, record)
                && !keys.holders.contains_key(&key)
            {
                keys.holders.insert(key.clone(), Holder::Elsewhere);
                first.push((key, event_id));
            }
        }
        if first.is_empty() {
            return Ok(keys);
        }
        let claims: Vec<(&str, &str)> = first.iter().map(|(k, e)| (k.as_str(), *e)).collect();
        let got = business_keys::claim_many(tx, pipeline.handler.name(), &claims, dedup.window).await?;
        for (key, event_id) in first {
            if got.contains(event_id) {
                keys.holders.insert(key, Holder::Event(event_id.to_owned()));
            }
        }
        Ok(keys)
    }

    /// `record`'s turn: whether it runs, claiming its key first if a parked
    /// holder freed it.
    pub async fn turn(
        &mut self,
        pipeline: &Pipeline,
        tx: &mut Tx,
        record: &Record,
        event_id: &str,
    ) -> Result<Turn, DbError> {
        let Some((key, dedup)) = pipeline.business_key(record) else {
            return Ok(Turn::Run);
        };
        match self.holders.get(&key) {
            Some(Holder::Event(holder)) if holder == event_id => Ok(Turn::RunHolding(key)),
            Some(Holder::Event(_) | Holder::Elsewhere) => Ok(Turn::DuplicateByKey),
            // Freed by a parked holder (or, defensively, never claimed).
            Some(Holder::Free) | None => {
                let claim = [(key.as_str(), event_id)];
                let got =
                    business_keys::claim_many(tx, pipeline.handler.name(), &claim, dedup.window).await?;
                if got.contains(event_id) {
                    self.holders
                        .insert(key.clone(), Holder::Event(event_id.to_owned()));
                    Ok(Turn::RunHolding(key))
                } else {
                    self.holders.insert(key, Holder::Elsewhere);
                    Ok(Turn::DuplicateByKey)
                }
            }
        }
    }

    /// An event that held `key` (if any) was parked, releasing it in the
    /// transaction: the next event with the key claims it.
    pub fn freed_by(&mut self, key: Option<String>) {
        if let Some(key) = key {
            self.holders.insert(key, Holder::Free);
        }
    }

    /// Keys held by `event_ids` (events that will not run in this
    /// transaction: a retry ended it before them), to release.
    pub fn held_by<'a>(&'a self, event_ids: &'a [String]) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.holders.iter().filter_map(move |(key, holder)| match holder {
            Holder::Event(id) if event_ids.contains(id) => Some((key.as_str(), id.as_str())),
            _ => None,
        })
    }
}
