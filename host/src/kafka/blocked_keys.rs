//! Key order's memory of the keys that parked letters block in one
//! partition: SHA-256 digests, not keys (a key may be as large as a
//! record), at most [`MAX_BLOCKED_KEYS`] of them, read again from the
//! database while at that bound. The memory only saves work: each batch
//! looks at the letters again in its transaction (`blocked_among`).

use crate::db::dead_letters::{KeyDigest, key_digest};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Keys a partition task remembers as blocked, at most (about 4 MiB). At
/// the bound the partition stops reading, and the set is read again every
/// [`RELOAD`] until letters replayed or discarded make room: a record of a
/// key the task did not remember would run into its batch's own look at
/// the letters and come back, again and again. Before the bound, a team's
/// distinct keys, each parked, grew the task for good (the twelfth and
/// thirteenth reads of issue 23's third round).
pub(super) const MAX_BLOCKED_KEYS: usize = 65_536;

/// How often a partition at [`MAX_BLOCKED_KEYS`] reads its blocked keys again.
pub(super) const RELOAD: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(super) struct BlockedKeys {
    digests: HashSet<KeyDigest>,
    /// While at the bound: when to read the set again.
    reload_at: Option<Instant>,
}

impl BlockedKeys {
    /// Whether a parked letter blocks `key` (cheap while none does).
    /// Whether the key of this digest is blocked.
    pub fn blocks(&self, key: &KeyDigest) -> bool {
        self.digests.contains(key)
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Keys a batch, retry or hold found blocked.
    pub fn learn<'a>(&mut self, keys: impl IntoIterator<Item = &'a Vec<u8>>) {
        self.digests.extend(keys.into_iter().map(|key| key_digest(key)));
    }

    /// A key whose letters were all released.
    pub fn release(&mut self, key: &[u8]) {
        self.digests.remove(&key_digest(key));
    }

    /// At the bound: the partition is not read.
    pub fn full(&self) -> bool {
        self.digests.len() >= MAX_BLOCKED_KEYS
    }

    /// At the bound and due to be read again; `Some(true)` the first time
    /// (the caller warns then).
    pub fn reload_due(&self) -> Option<bool> {
        (self.full() && self.reload_at.is_none_or(|at| at <= Instant::now()))
            .then_some(self.reload_at.is_none())
    }

    /// What was read at an assignment replaces what was known.
    pub fn replace(&mut self, read: HashSet<KeyDigest>) {
        self.digests = read;
    }

    /// What a read at the bound found, keeping the keys of `waiting` records
    /// known to be blocked (the read has only the first keys in the index's
    /// order: the fourteenth read). The next read is due [`RELOAD`] from now,
    /// however long this one took.
    pub fn reloaded<'a>(&mut self, read: HashSet<KeyDigest>, waiting: impl Iterator<Item = &'a KeyDigest>) {
        let kept: Vec<KeyDigest> = waiting
            .filter(|digest| self.digests.contains(*digest))
            .copied()
            .collect();
        self.digests = read;
        self.digests.extend(kept);
        self.reload_at = Some(Instant::now() + RELOAD);
    }

    /// When to wake to read again: `None` once below the bound.
    pub fn wake(&mut self) -> Option<Instant> {
        if !self.full() {
            self.reload_at = None;
        }
        self.reload_at
    }
}
