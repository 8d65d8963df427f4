//! Whose upload runs now: a bound on what uploads hold at once, and a charge
//! for the time a team's uploads hold what every team shares.
//!
//! An upload holds its component (up to `admin.max_component_mb`) in memory
//! while it is compiled and its migrations run, and its admission and
//! migrations hold what others wait for: on SQLite the database's only
//! writer (every handler's events wait), on PostgreSQL the deployments lock
//! (every other upload, activation and pause waits). Both were unbounded:
//! concurrent uploads held as many components as clients cared to send, and
//! a migration that failed at its 60 s deadline, uploaded again and again,
//! stopped every team's events (the sixth to eighth reads of this round,
//! issue 23). The operator's admin tokens are trusted and pass freely.

use super::ApiError;
use super::auth::{Caller, TokenScope};
use axum::http::StatusCode;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Team uploads read and checked at once on this host; more wait their turn
/// (up to [`SLOT_WAIT`]) before their body is read. A team token has at most
/// one upload in flight, so one team cannot take every slot.
const SLOTS: usize = 2;

/// How long an upload waits for a slot before it is answered 503.
const SLOT_WAIT: Duration = Duration::from_secs(120);

/// A team token's uploads may hold the shared writer or lock at most one
/// part in this many: after an upload that held it for `t`, the token's
/// next upload waits `(WRITER_SHARE - 1) * t` before its body is read.
/// Every upload is charged (a free allowance was a way around it:
/// migrations of 0.95 s, back to back, held it 80% of the time); a usual
/// one holds it for milliseconds, so the wait goes unnoticed.
const WRITER_SHARE: u32 = 3;

/// An upload whose charge would make it wait longer is refused (429).
const CHARGE_WAIT: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Ledger {
    /// Team tokens with an upload in flight.
    in_flight: HashSet<String>,
    /// When each charged team token may upload next.
    next: HashMap<String, Instant>,
}

pub struct UploadTurns {
    slots: Semaphore,
    ledger: Mutex<Ledger>,
}

impl Default for UploadTurns {
    fn default() -> Self {
        Self {
            slots: Semaphore::new(SLOTS),
            ledger: Mutex::default(),
        }
    }
}

impl UploadTurns {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The caller's turn, or 429 while another of its uploads runs or its
    /// last ones would make it wait more than [`CHARGE_WAIT`]. The turn
    /// charges the caller when it drops, however the upload ended (a client
    /// that went away too).
    pub fn begin(&self, caller: &Caller) -> Result<Turn<'_>, ApiError> {
        let team = !matches!(caller.scope, TokenScope::Admin);
        let mut not_before = None;
        if team {
            let mut ledger = self.ledger();
            let now = Instant::now();
            ledger.next.retain(|_, at| *at > now);
            if let Some(&at) = ledger.next.get(&caller.name) {
                if at > now + CHARGE_WAIT {
                    return Err(too_many(format!(
                        "this token's uploads may hold the database's shared writer or lock a third of the \
                         time: its next upload is accepted in {} s",
                        at.saturating_duration_since(now).as_secs() + 1
                    )));
                }
                not_before = Some(at);
            }
            if !ledger.in_flight.insert(caller.name.clone()) {
                return Err(too_many(
                    "another upload of this token is in progress: a token uploads one version at a time"
                        .into(),
                ));
            }
        }
        Ok(Turn {
            turns: self,
            caller: team.then(|| caller.name.clone()),
            not_before,
            writer_held_ms: AtomicU64::new(0),
        })
    }
}

fn too_many(message: String) -> ApiError {
    ApiError::new(StatusCode::TOO_MANY_REQUESTS, message)
}

/// One upload's turn (see [`UploadTurns::begin`]).
pub struct Turn<'a> {
    turns: &'a UploadTurns,
    /// The team token, `None` for an admin token.
    caller: Option<String>,
    /// Until when the token's earlier uploads are being paid for.
    not_before: Option<Instant>,
    writer_held_ms: AtomicU64,
}

impl Turn<'_> {
    /// A team upload's slot, once its charge is paid (503 after
    /// [`SLOT_WAIT`] more); an admin's takes none.
    pub async fn slot(&self) -> Result<Option<SemaphorePermit<'_>>, ApiError> {
        if self.caller.is_none() {
            return Ok(None);
        }
        if let Some(at) = self.not_before {
            tokio::time::sleep_until(at.into()).await;
        }
        match tokio::time::timeout(SLOT_WAIT, self.turns.slots.acquire()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            _ => Err(ApiError::unavailable(format!(
                "this host checks {SLOTS} team uploads at a time and none finished within {} s; try again later",
                SLOT_WAIT.as_secs()
            ))),
        }
    }

    /// Where the upload records how long it held the writer or lock.
    pub fn writer_held_ms(&self) -> &AtomicU64 {
        &self.writer_held_ms
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let Some(caller) = self.caller.take() else {
            return;
        };
        let held = Duration::from_millis(self.writer_held_ms.load(Ordering::Relaxed));
        let mut ledger = self.turns.ledger();
        ledger.in_flight.remove(&caller);
        if !held.is_zero() {
            let until = Instant::now() + held * (WRITER_SHARE - 1);
            let at = ledger.next.entry(caller).or_insert(until);
            *at = (*at).max(until);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(name: &str, scope: TokenScope) -> Caller {
        Caller::for_test(name, scope)
    }

    fn held(turn: &Turn<'_>, time: Duration) {
        turn.writer_held_ms()
            .store(time.as_millis() as u64, Ordering::Relaxed);
    }

    /// Regression (the sixth to eighth reads of this round, issue 23): a
    /// team's migration that failed at its 60 s deadline, uploaded again and
    /// again, held SQLite's only writer for good; one token's concurrent
    /// uploads took every slot.
    #[tokio::test]
    async fn a_team_pays_for_the_writer_time_of_its_uploads_and_runs_one_at_a_time() {
        let turns = UploadTurns::default();
        let team = caller("team-a", TokenScope::Handlers(vec!["a".into()]));
        let other = caller("team-b", TokenScope::Handlers(vec!["b".into()]));
        let operator = caller("ops", TokenScope::Admin);

        let first = turns.begin(&team).unwrap();
        assert!(first.slot().await.unwrap().is_some());
        let second = turns.begin(&team).err().expect("one upload per token at a time");
        assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            second.message.contains("one version at a time"),
            "{}",
            second.message
        );
        // A short one is charged too, twice what it held: the next one waits.
        held(&first, Duration::from_millis(100));
        drop(first);
        let next = turns.begin(&team).unwrap();
        let waited = Instant::now();
        assert!(next.slot().await.unwrap().is_some());
        assert!(
            waited.elapsed() >= Duration::from_millis(150),
            "{:?}",
            waited.elapsed()
        );
        held(&next, Duration::from_secs(70));
        // Another team, and the operator, are not held up by it.
        let theirs = turns.begin(&other).unwrap();
        let ops = turns.begin(&operator).unwrap();
        assert!(ops.slot().await.unwrap().is_none(), "the operator takes no slot");
        held(&ops, Duration::from_secs(70));
        drop((ops, theirs));
        turns.begin(&operator).expect("the operator never waits");
        drop(next);
        let refused = turns.begin(&team).err().expect("140 s to wait is refused");
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            refused.message.contains("accepted in 140 s"),
            "{}",
            refused.message
        );
        turns
            .begin(&other)
            .expect("only the team that held the writer pays");
    }

    #[test]
    fn a_short_upload_does_not_shorten_a_long_charge() {
        let turns = UploadTurns::default();
        let team = caller("team-a", TokenScope::Handlers(vec!["a".into()]));
        let mut ledger = turns.ledger();
        ledger
            .next
            .insert("team-a".into(), Instant::now() + Duration::from_secs(200));
        drop(ledger);
        let turn = Turn {
            turns: &turns,
            caller: Some("team-a".into()),
            not_before: None,
            writer_held_ms: AtomicU64::new(1_500),
        };
        drop(turn);
        let refused = turns.begin(&team).err().expect("still charged");
        assert!(
            refused.message.contains("accepted in 200 s"),
            "{}",
            refused.message
        );
    }
}
