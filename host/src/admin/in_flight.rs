//! One request of a kind in flight per team token: for the requests that run
//! a handler's guest (dead-letter replays, and discards, which replay the
//! letters held behind them) or rewrite or read every row of a kind (an
//! outbox re-queue, a dead-letter group listing). On SQLite the first hold
//! the only writer while the guest runs: a hundred concurrent replays of one
//! letter whose guest spins to its deadline each took the writer for that
//! long in turn, every other handler's events queued behind them (the eighth
//! to tenth reads of this round, issue 23). The operator's admin tokens are
//! not limited.

use super::ApiError;
use super::auth::{Caller, TokenScope};
use axum::http::StatusCode;
use std::collections::HashSet;
use std::sync::Mutex;

#[derive(Default)]
pub struct InFlight {
    tokens: Mutex<HashSet<String>>,
    /// Woken when a token's request ends (see [`InFlight::wait`]).
    freed: tokio::sync::Notify,
}

/// How long [`InFlight::wait`] waits for the token's other request.
const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl InFlight {
    /// The caller's turn, or 429 naming `what` while another of its
    /// requests of this kind runs; it ends when the returned value drops
    /// (a client that went away too).
    pub fn enter(&self, caller: &Caller, what: &str) -> Result<Entered<'_>, ApiError> {
        if matches!(caller.scope, TokenScope::Admin) {
            return Ok(Entered {
                set: self,
                token: None,
            });
        }
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        if !tokens.insert(caller.name.clone()) {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("another {what} of this token is in progress: a token runs one at a time"),
            ));
        }
        Ok(Entered {
            set: self,
            token: Some(caller.name.clone()),
        })
    }
}

impl InFlight {
    /// As [`InFlight::enter`], waiting (up to a minute, then 503) for the
    /// token's request of this kind that runs: for reads a page makes
    /// several of, where a refusal would only show an error.
    pub async fn wait(&self, caller: &Caller, what: &str) -> Result<Entered<'_>, ApiError> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the try, so a request ending in between wakes it.
            freed.as_mut().enable();
            if let Ok(entered) = self.enter(caller, what) {
                return Ok(entered);
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(ApiError::unavailable(format!(
                    "another {what} of this token ran for more than {} s; try again later",
                    WAIT.as_secs()
                )));
            }
        }
    }
}

pub struct Entered<'a> {
    set: &'a InFlight,
    token: Option<String>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            self.set
                .tokens
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&token);
            self.set.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(name: &str, scope: TokenScope) -> Caller {
        Caller::for_test(name, scope)
    }

    #[test]
    fn a_team_token_replays_one_at_a_time() {
        let replays = InFlight::default();
        let team = caller("team-a", TokenScope::Handlers(vec!["a".into()]));
        let other = caller("team-b", TokenScope::Handlers(vec!["b".into()]));
        let ops = caller("ops", TokenScope::Admin);
        let first = replays.enter(&team, "replay").unwrap();
        let refused = replays.enter(&team, "replay").err().unwrap();
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            refused.message.contains("another replay of this token"),
            "{}",
            refused.message
        );
        let _theirs = replays.enter(&other, "replay").unwrap();
        let _a = replays.enter(&ops, "replay").unwrap();
        let _b = replays.enter(&ops, "replay").unwrap();
        drop(first);
        replays
            .enter(&team, "replay")
            .expect("its turn again once the first ended");
    }

    #[tokio::test]
    async fn a_listing_waits_for_the_tokens_other_one() {
        let listings = InFlight::default();
        let team = caller("team-a", TokenScope::Handlers(vec!["a".into()]));
        let first = listings.enter(&team, "listing").unwrap();
        let second = listings.wait(&team, "listing");
        tokio::pin!(second);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), second.as_mut())
                .await
                .is_err(),
            "it waits while the first runs"
        );
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(5), second)
            .await
            .expect("woken when the first ended")
            .unwrap();
    }
}
