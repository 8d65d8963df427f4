//! A scripted native handler: the pipeline's tests put it where a Wasm
//! component would be, so the batch paths run on a real database without
//! Kafka, Wasm or a child process.
//!
//! Each call follows the script of its event id (or of that id's attempt):
//! guest statements in the handler's own tables through `Tx::guest_execute`
//! (what a guest's `sql.execute` reaches, minus the statement guard), outbox
//! messages, a [`GuestFailure`], or a host statement behind the walls' back
//! that only the invariant check can catch. Every call is logged, with the
//! statement errors it saw, so a test can say how often the handler ran.
//! Test-only: it never enforces anything itself.

use crate::db::outbox::NewMessage;
use crate::db::{Tx, Walls};
use crate::handler::{GuestFailure, Handler, Invocation};
use crate::record::Record;
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::sync::Mutex;

/// The handler's own table, created by its migration (see the harness).
pub const EFFECTS: &str = "effects";

/// One step of a call, run in order; a [`Act::Fail`] ends the call.
#[derive(Debug, Clone)]
pub enum Act {
    /// `INSERT INTO effects (event_id, attempt)` as a guest statement; if it
    /// fails the call ends asking to retry (as a careful guest would).
    Effect,
    /// A guest statement whose error the handler notes and then ignores.
    TrySql(&'static str),
    /// Counts the rows of `effects` this call can see (committed ones and
    /// those of its own transaction) into [`Call::effects_seen`].
    CountEffects,
    /// Publishes a message to `topic`, keyed by the event id.
    Publish(&'static str),
    /// Ends the call with this failure.
    Fail(GuestFailure),
    /// Takes this long (a slow handler), holding its transaction.
    Sleep(std::time::Duration),
    /// Steps out of its walls and deletes its own event's inbox claim with a
    /// host statement (`Tx::execute`), then puts the walls back up: what a
    /// hole in the walls would allow, so only the invariant check sees it.
    BreakInbox,
}

/// What a call without a script of its own does: one effect row.
fn default_script() -> Vec<Act> {
    vec![Act::Effect]
}

/// One logged call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub event_id: String,
    pub attempt: u32,
    /// The errors its guest statements returned, in order.
    pub errors: Vec<String>,
    /// What its last [`Act::CountEffects`] found.
    pub effects_seen: Option<i64>,
    /// The time the host gave the call.
    pub budget: std::time::Duration,
}

pub struct Scripted {
    name: String,
    walls: Walls,
    max_payload_bytes: usize,
    /// Per event id, for every attempt.
    scripts: Mutex<HashMap<String, Vec<Act>>>,
    /// Per (event id, attempt): wins over `scripts`.
    attempts: Mutex<HashMap<(String, u32), Vec<Act>>>,
    calls: Mutex<Vec<Call>>,
}

impl Scripted {
    pub fn new(name: &str, walls: Walls, max_payload_bytes: usize) -> Self {
        Self {
            name: name.to_owned(),
            walls,
            max_payload_bytes,
            scripts: Mutex::default(),
            attempts: Mutex::default(),
            calls: Mutex::default(),
        }
    }

    /// Every call for `event_id` runs `acts`.
    pub fn on(&self, event_id: &str, acts: Vec<Act>) {
        self.scripts.lock().unwrap().insert(event_id.to_owned(), acts);
    }

    /// The call for `event_id`'s `attempt` runs `acts`.
    pub fn on_attempt(&self, event_id: &str, attempt: u32, acts: Vec<Act>) {
        let key = (event_id.to_owned(), attempt);
        self.attempts.lock().unwrap().insert(key, acts);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The calls as (event id, attempt), in the order they ran.
    pub fn call_order(&self) -> Vec<(String, u32)> {
        self.calls()
            .into_iter()
            .map(|c| (c.event_id, c.attempt))
            .collect()
    }

    /// How many times the handler ran for `event_id`.
    pub fn calls_for(&self, event_id: &str) -> usize {
        self.calls().iter().filter(|c| c.event_id == event_id).count()
    }

    fn script(&self, event_id: &str, attempt: u32) -> Vec<Act> {
        let key = (event_id.to_owned(), attempt);
        if let Some(acts) = self.attempts.lock().unwrap().get(&key) {
            return acts.clone();
        }
        let scripts = self.scripts.lock().unwrap();
        scripts.get(event_id).cloned().unwrap_or_else(default_script)
    }

    async fn run(
        &self,
        tx: &mut Tx,
        acts: Vec<Act>,
        call: &mut Call,
    ) -> Result<Vec<NewMessage>, GuestFailure> {
        let mut outbox = Vec::new();
        for act in acts {
            match act {
                Act::Effect => {
                    let sql = format!("INSERT INTO {EFFECTS} (event_id, attempt) VALUES ($1, $2)");
                    let params = [call.event_id.as_str().into(), i64::from(call.attempt).into()];
                    if let Err(error) = tx.guest_execute(&sql, &params).await {
                        call.errors.push(error.to_string());
                        return Err(GuestFailure::Retry(error.to_string()));
                    }
                }
                Act::TrySql(sql) => {
                    if let Err(error) = tx.guest_execute(sql, &[]).await {
                        call.errors.push(error.to_string());
                    }
                }
                Act::CountEffects => {
                    let sql = format!("SELECT COUNT(*) FROM {EFFECTS}");
                    let rows = tx.guest_query(&sql, &[], 1, 64).await;
                    let rows = rows.map_err(|e| GuestFailure::Trap(e.to_string()))?;
                    call.effects_seen = rows.first().and_then(|r| r.first()).and_then(|v| v.as_i64());
                }
                Act::Publish(topic) => outbox.push(NewMessage {
                    id: uuid::Uuid::now_v7().to_string(),
                    topic: topic.to_owned(),
                    key: Some(call.event_id.clone().into_bytes()),
                    payload: call.event_id.clone().into_bytes(),
                    headers: vec![],
                }),
                Act::Fail(failure) => return Err(failure),
                Act::Sleep(time) => tokio::time::sleep(time).await,
                Act::BreakInbox => {
                    // As if every wall had fallen: the host's own unclaim
                    // (on PostgreSQL through its gate, with its key).
                    tx.leave_walls().await.expect("leave the walls");
                    crate::db::inbox::unclaim(tx, &self.name, &call.event_id)
                        .await
                        .expect("delete the claim");
                    tx.enter_walls(&self.walls).await.expect("walls back up");
                }
            }
        }
        Ok(outbox)
    }
}

impl Handler for Scripted {
    fn name(&self) -> &str {
        &self.name
    }

    fn version_label(&self) -> &str {
        "scripted"
    }

    fn max_payload_bytes(&self) -> usize {
        self.max_payload_bytes
    }

    fn walls(&self) -> &Walls {
        &self.walls
    }

    fn timeout(&self) -> std::time::Duration {
        self.walls.statement_timeout()
    }

    fn invoke<'a>(
        &'a self,
        mut tx: Tx,
        _record: &'a Record,
        event_id: &'a str,
        attempt: u32,
        budget: std::time::Duration,
    ) -> BoxFuture<'a, Invocation> {
        Box::pin(async move {
            let mut call = Call {
                event_id: event_id.to_owned(),
                attempt,
                errors: vec![],
                effects_seen: None,
                budget,
            };
            let acts = self.script(event_id, attempt);
            let result = self.run(&mut tx, acts, &mut call).await;
            self.calls.lock().unwrap().push(call);
            let (result, outbox) = match result {
                Ok(outbox) => (Ok(()), outbox),
                Err(failure) => (Err(failure), vec![]),
            };
            Invocation {
                tx: Some(tx),
                result,
                host_error: None,
                outbox,
            }
        })
    }
}
