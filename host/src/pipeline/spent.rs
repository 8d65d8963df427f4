//! The time each event's current attempt has already run, over every run
//! the host gave up and ran again: an optimistic batch redone, a batch of
//! held-back INSERTs that failed at their flush, a batch SQLite rolled back
//! at a deadline and run one record at a time, a transaction the database
//! refused. An attempt has the handler's timeout in all, whichever of these
//! ran it again: with a fresh timeout each, one attempt held its instance
//! and connection (on SQLite, the only writer) for a multiple of its
//! deadline (the forty-eighth and forty-ninth reads).
//!
//! Only calls that took [`NOTED_FROM`] or more are noted: a fast call run
//! again costs nothing worth counting, and the hot path then pays one
//! lookup in a near-empty map. Entries live two [`WINDOW`]s at most (runs
//! again follow within seconds), so the map holds only the slow calls of
//! the last minutes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A call shorter than this is not noted.
pub const NOTED_FROM: Duration = Duration::from_millis(100);
/// How long a noted time is kept, at least (at most twice this): longer
/// than any backoff between runs of one attempt.
const WINDOW: Duration = Duration::from_secs(120);

/// By event id: the attempt and the time its earlier runs took.
#[derive(Debug)]
pub struct Spent {
    current: HashMap<String, (u32, Duration)>,
    previous: HashMap<String, (u32, Duration)>,
    since: Instant,
}

impl Default for Spent {
    fn default() -> Self {
        Self {
            current: HashMap::new(),
            previous: HashMap::new(),
            since: Instant::now(),
        }
    }
}

impl Spent {
    /// What `attempt` of `event_id` ran before, in runs given up.
    pub fn before(&self, event_id: &str, attempt: u32) -> Duration {
        let noted = self.current.get(event_id).or_else(|| self.previous.get(event_id));
        match noted {
            Some((noted_attempt, took)) if *noted_attempt == attempt => *took,
            _ => Duration::ZERO,
        }
    }

    /// A run of `attempt` of `event_id` took `took`.
    pub fn add(&mut self, event_id: &str, attempt: u32, took: Duration) {
        let before = self.before(event_id, attempt);
        if before.is_zero() && took < NOTED_FROM {
            return;
        }
        if self.since.elapsed() >= WINDOW {
            self.previous = std::mem::take(&mut self.current);
            self.since = Instant::now();
        }
        self.previous.remove(event_id);
        self.current.insert(event_id.to_owned(), (attempt, before + took));
    }

    #[cfg(test)]
    fn age(&mut self, by: Duration) {
        self.since -= by;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempts_runs_add_up_and_a_new_attempt_starts_afresh() {
        let mut spent = Spent::default();
        spent.add("e", 1, Duration::from_millis(5));
        assert_eq!(spent.before("e", 1), Duration::ZERO, "a fast run is not noted");
        spent.add("e", 1, Duration::from_secs(2));
        spent.add("e", 1, Duration::from_millis(5));
        assert_eq!(
            spent.before("e", 1),
            Duration::from_millis(2005),
            "once noted, every run counts"
        );
        assert_eq!(spent.before("e", 2), Duration::ZERO);
        assert_eq!(spent.before("other", 1), Duration::ZERO);
        spent.add("e", 2, Duration::from_secs(1));
        assert_eq!(spent.before("e", 2), Duration::from_secs(1));
        assert_eq!(
            spent.before("e", 1),
            Duration::ZERO,
            "the newer attempt replaced it"
        );
    }

    #[test]
    fn noted_times_are_forgotten_after_two_windows() {
        let mut spent = Spent::default();
        spent.add("old", 1, Duration::from_secs(1));
        spent.age(WINDOW);
        spent.add("new", 1, Duration::from_secs(1));
        assert_eq!(
            spent.before("old", 1),
            Duration::from_secs(1),
            "kept one window more"
        );
        spent.age(WINDOW);
        spent.add("newer", 1, Duration::from_secs(1));
        assert_eq!(spent.before("old", 1), Duration::ZERO);
        assert_eq!(spent.before("new", 1), Duration::from_secs(1));
    }
}
