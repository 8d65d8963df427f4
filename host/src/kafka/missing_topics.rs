//! Topics the broker says do not exist, as the relay learns them: a message
//! to one is parked once it has failed for [`STUCK`], later messages to it
//! are parked at once for a while, and a handler that published to one is
//! not waited for again, so the messages behind them go on.
//!
//! Why: an unknown topic is a passing failure (it may be created any moment),
//! and a handler's messages wait behind its first failing one to keep their
//! order. Once a whole bucket waited, and a bucket holds the messages of
//! every handler whose (handler, key) hashes to it, so one team that
//! published to a topic nobody created (its token's topic allowlist may be a
//! prefix) held back every other team's messages in those buckets, for
//! good: 64 keys were enough for all of them (the sixth read of this round,
//! issue 23). Other handlers' messages no longer wait (the forty-ninth
//! read), but the failing handler's own would, for good, without this. Every fresh topic name once got
//! its own wait, so a handler with hundreds of names of topics nobody made
//! stalled the buckets for hours (the seventh read): the wait is now paid
//! once per handler an hour. The broker being away is not this: it fails
//! every bucket alike and is retried for as long as it lasts.
//!
//! What one handler learns parks only its own messages: a quarantine is per
//! (handler, topic). Per topic, a team that published to a topic before it
//! was created had every other team's messages to it parked without a try
//! for minutes after it was (the forty-eighth read).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a bucket's first message may fail for an unknown topic before it
/// is parked: time for a deployment to create the topic it publishes to,
/// and as long as other handlers' messages in the bucket wait behind it.
pub const STUCK: Duration = Duration::from_secs(60);

/// After a park, messages to the same topic are parked without a try for
/// this long; then one is tried again (librdkafka takes up to its
/// `topic.metadata.propagation.max.ms`, 30 s, to say no).
pub const QUARANTINE: Duration = Duration::from_secs(300);

/// A topic confirmed missing within this long, or a message of a handler
/// that had one parked within this long, is parked at its next failure for
/// a missing topic, without waiting [`STUCK`] again.
const REMEMBERED: Duration = Duration::from_secs(3600);

/// A failing message not seen failing again for this long is forgotten: the
/// relay tries a failing message at least every few seconds (its backoff is
/// at most 5 s), so it went or was parked.
const FORGOTTEN: Duration = Duration::from_secs(600);

/// Whether `error` says the message's topic (or partition) does not exist.
pub fn is_missing_topic(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as Code;
    matches!(
        error.rdkafka_error_code(),
        Some(Code::UnknownTopicOrPartition | Code::UnknownTopic | Code::UnknownPartition)
    )
}

/// By handler, the topics its messages are parked to without a try.
pub type Quarantined = HashMap<String, HashSet<String>>;

/// Whether `handler`'s messages to `topic` are quarantined.
pub fn is_quarantined(quarantined: &Quarantined, handler: &str, topic: &str) -> bool {
    quarantined
        .get(handler)
        .is_some_and(|topics| topics.contains(topic))
}

#[derive(Debug)]
pub struct MissingTopics {
    stuck_after: Duration,
    /// Messages failing for a missing topic, by (handler, seq): since when,
    /// and when last. Per message, not per handler: a handler has a first
    /// message in each bucket its keys hash to, and with one entry per
    /// handler each bucket's failure restarted the others' wait, so a
    /// handler failing in two buckets was never parked (the fifty-third read).
    failing: HashMap<(String, i64), (Instant, Instant)>,
    /// (handler, topic) confirmed missing (a message of the handler to the
    /// topic was parked), and when last.
    confirmed: HashMap<(String, String), Instant>,
    /// Handlers that had a message to a missing topic parked, and when last.
    publishers: HashMap<String, Instant>,
}

impl Default for MissingTopics {
    fn default() -> Self {
        Self::new(STUCK)
    }
}

impl MissingTopics {
    pub fn new(stuck_after: Duration) -> Self {
        Self {
            stuck_after,
            failing: HashMap::new(),
            confirmed: HashMap::new(),
            publishers: HashMap::new(),
        }
    }

    /// Each handler's topics whose messages are parked without a try now.
    pub fn quarantined(&self) -> Arc<Quarantined> {
        let mut quarantined = Quarantined::new();
        for ((handler, topic), at) in &self.confirmed {
            if at.elapsed() < QUARANTINE {
                quarantined
                    .entry(handler.clone())
                    .or_default()
                    .insert(topic.clone());
            }
        }
        Arc::new(quarantined)
    }

    /// Message `seq` of `handler`, the first of its own still to go,
    /// failed because `topic` is unknown: the reason to park it now, if it
    /// is time.
    pub fn failed(&mut self, seq: i64, handler: &str, topic: &str, error: &str) -> Option<String> {
        self.confirmed.retain(|_, at| at.elapsed() < REMEMBERED);
        self.publishers.retain(|_, at| at.elapsed() < REMEMBERED);
        // A message that stopped failing (it went, or was parked or
        // discarded by an operator) is forgotten once its failures stop.
        self.failing.retain(|_, (_, last)| last.elapsed() < FORGOTTEN);
        let pair = (handler.to_owned(), topic.to_owned());
        let known = self.confirmed.contains_key(&pair) || self.publishers.contains_key(handler);
        let now = Instant::now();
        let (since, last) = self
            .failing
            .entry((handler.to_owned(), seq))
            .or_insert((now, now));
        *last = now;
        if !known && since.elapsed() < self.stuck_after {
            return None;
        }
        self.failing.remove(&(handler.to_owned(), seq));
        self.confirmed.insert(pair, Instant::now());
        self.publishers.insert(handler.to_owned(), Instant::now());
        Some(parked_reason(topic, error))
    }

    /// Message `seq` of `handler` went, or failed for another reason: a
    /// later failure for a missing topic starts its wait over.
    pub fn settled(&mut self, handler: &str, seq: i64) {
        self.failing.remove(&(handler.to_owned(), seq));
    }
}

/// Why a message to a quarantined topic is parked without a try.
pub fn quarantined_reason(topic: &str) -> String {
    parked_reason(
        topic,
        "a message to it was parked for this within the last minutes",
    )
}

fn parked_reason(topic: &str, error: &str) -> String {
    format!(
        "the topic {topic:?} does not exist ({error}); the message is parked so the messages \
         behind it go on: create the topic, then retry the message"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_topic_parks_after_the_wait_then_at_once() {
        let mut missing = MissingTopics::new(Duration::from_millis(50));
        assert_eq!(missing.failed(10, "a", "nowhere", "unknown topic"), None);
        assert!(missing.quarantined().is_empty());
        std::thread::sleep(Duration::from_millis(60));
        let reason = missing.failed(10, "a", "nowhere", "unknown topic").unwrap();
        assert!(
            reason.contains("\"nowhere\" does not exist") && reason.contains("retry"),
            "{reason}"
        );
        assert!(is_quarantined(&missing.quarantined(), "a", "nowhere"));
        // Only for handler a (the forty-eighth read): another handler's
        // message to the topic waits its own time, since the topic may have
        // been created meanwhile, and is never parked without a try.
        assert!(!is_quarantined(&missing.quarantined(), "b", "nowhere"));
        assert_eq!(missing.failed(20, "b", "nowhere", "unknown topic"), None);
        missing.settled("b", 20);
        // And handler a's next missing topic, whatever its name (the seventh read).
        assert!(missing.failed(40, "a", "fresh-name", "unknown topic").is_some());
        // Another handler's new missing topic waits its time; a message that
        // goes, or fails otherwise, starts the wait over.
        assert_eq!(missing.failed(30, "c", "later", "unknown topic"), None);
        missing.settled("c", 30);
        assert_eq!(missing.failed(30, "c", "later", "unknown topic"), None);
        // A new first message of the handler starts its own wait.
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(missing.failed(31, "c", "later", "unknown topic"), None);
    }

    /// A handler's messages failing in several buckets each wait their own
    /// time, and one's failures or another's success restart no other's
    /// wait: with one wait per handler, two buckets failing in turn kept
    /// restarting it and nothing was ever parked (the fifty-third read).
    #[test]
    fn a_handlers_messages_in_several_buckets_each_park_after_their_wait() {
        let mut missing = MissingTopics::new(Duration::from_millis(50));
        let started = Instant::now();
        let mut parked = Vec::new();
        while parked.len() < 2 && started.elapsed() < Duration::from_secs(2) {
            for seq in [1, 2] {
                if !parked.contains(&seq) && missing.failed(seq, "a", "nowhere", "unknown topic").is_some() {
                    parked.push(seq);
                }
            }
            // Its messages in a third bucket go meanwhile.
            missing.settled("a", 3);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(parked, [1, 2], "both failing messages are parked after the wait");
        assert!(started.elapsed() < Duration::from_millis(500));
    }

    #[test]
    fn only_a_missing_topic_is_one() {
        let missing = KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopicOrPartition);
        assert!(is_missing_topic(&missing));
        let away = KafkaError::MessageProduction(RDKafkaErrorCode::AllBrokersDown);
        assert!(!is_missing_topic(&away));
        let timed_out = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        assert!(!is_missing_topic(&timed_out));
    }
}
