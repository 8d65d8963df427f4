//! The per-handler counts `/metrics` and `/v1/overview` show (dead letters
//! parked and held, outbox backlog, parked and oldest pending message), read
//! at most once a second for all callers.
//!
//! Each is a `GROUP BY` over a host table: `/metrics` is open, and a scraper
//! or a team polling the overview in a loop ran five of them per request,
//! each on a connection of the pool the pipeline writes through (issue 23,
//! the seventeenth read's list of what was still open). One read runs at a
//! time; requests meanwhile wait for it and take its answer.

use crate::db::{Database, DbError, dead_letters, outbox};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one read of the counts serves every request.
const FRESH: Duration = Duration::from_secs(1);

/// Counts per handler name.
#[derive(Debug, Default)]
pub struct Counts {
    pub dead_letters_parked: BTreeMap<String, i64>,
    pub held_records: BTreeMap<String, i64>,
    pub outbox_backlog: BTreeMap<String, i64>,
    pub outbox_parked: BTreeMap<String, i64>,
    /// When the oldest pending message of each handler was written.
    pub oldest_pending: BTreeMap<String, i64>,
}

/// The last read of [`Counts`], and when it was taken.
#[derive(Default)]
pub struct CountsCache(Arc<tokio::sync::Mutex<Last>>);

/// The last counts read, and when the last read (of any outcome) ended.
#[derive(Default)]
struct Last {
    counts: Option<Arc<Counts>>,
    tried_at: Option<Instant>,
    failure: Option<String>,
}

/// How long one read of the counts may take; past it, the last counts answer.
const DEADLINE: Duration = Duration::from_secs(5);

impl CountsCache {
    /// The counts, read now unless a read under [`FRESH`] old answers (or
    /// failed: a failure is remembered as long, so a slow database gets
    /// one read a second, not one per request waiting: the twentieth
    /// read). The read runs on a task of its own that holds the turn: a
    /// request that goes away neither ends it nor lets the next request
    /// start another (the nineteenth read). One past [`DEADLINE`] answers
    /// with the last counts, if there are any; a request waits at most
    /// twice that.
    pub async fn get(&self, db: &Database) -> Result<Arc<Counts>, String> {
        let (last, db) = (self.0.clone(), db.clone());
        let read = tokio::spawn(async move {
            let mut last = last.lock().await;
            if last.tried_at.is_some_and(|at| at.elapsed() < FRESH) {
                return last.answer();
            }
            let read = tokio::time::timeout(DEADLINE, read(&db)).await;
            last.tried_at = Some(Instant::now());
            match read {
                Ok(Ok(counts)) => {
                    last.counts = Some(Arc::new(counts));
                    last.failure = None;
                }
                Ok(Err(error)) => last.failure = Some(error.to_string()),
                Err(_) => last.failure = Some(format!("counting took more than {DEADLINE:?}")),
            }
            last.answer()
        });
        match tokio::time::timeout(2 * DEADLINE, read).await {
            Ok(Ok(answer)) => answer,
            // A panic in the read is the host's bug, as in any request.
            Ok(Err(error)) => Err(format!("counting failed: {error}")),
            Err(_) => Err(format!("the counts were not read within {:?}", 2 * DEADLINE)),
        }
    }
}

impl Last {
    /// The last counts, stale or not; the last failure if there are none.
    fn answer(&self) -> Result<Arc<Counts>, String> {
        match (&self.counts, &self.failure) {
            (Some(counts), _) => Ok(counts.clone()),
            (None, failure) => Err(format!(
                "the counts could not be read: {}",
                failure.as_deref().unwrap_or("no read yet")
            )),
        }
    }
}

async fn read(db: &Database) -> Result<Counts, DbError> {
    // Each statement ends in the server at the deadline too, not only here
    // (the twentieth read: a count the host gave up on ran on in PostgreSQL).
    let db = &db.with_read_deadline(DEADLINE);
    Ok(Counts {
        dead_letters_parked: dead_letters::parked_counts(db).await?,
        held_records: dead_letters::held_counts(db).await?,
        outbox_backlog: outbox::backlog_counts(db).await?,
        outbox_parked: outbox::parked_counts(db).await?,
        oldest_pending: outbox::oldest_pending(db).await?,
    })
}
