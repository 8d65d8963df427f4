//! Loading a handler component once, and invoking it for one event.
//!
//! Loading compiles and links once (`HandlerPre`, a cached `InstancePre`);
//! each invocation gets a fresh `Store` and instance, so a guest that trapped
//! or ran out of a limit costs only its own event. With `instances.reuse` an
//! instance that ended its event cleanly is kept for a later one, until its
//! memory or its event count passes the handler's recycle bounds.

use super::engine::WasmEngine;
use super::state::StoreState;
use super::warm::{self, Warm, WarmPool};
use crate::bindings::{Event, HandlerError, HandlerPre};
use crate::capabilities::log::LogTag;
use crate::capabilities::outbox::OutboxState;
use crate::db::{DbError, Tx, Walls};
use crate::handler::{GuestFailure, Invocation, LimitExceeded, Limits};
use crate::record::Record;
use crate::sandbox::Guard;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use wasmtime::{Store, Trap};

/// Extra time past `limits.timeout_ms` before the host gives up on a call that
/// is stuck in a host function (epoch interruption only stops wasm code).
const BACKSTOP_GRACE: Duration = Duration::from_secs(1);
/// Keep dead-letter reasons readable and bounded.
const MAX_REASON_BYTES: usize = 2048;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read component {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error(
        "{path} is a core WebAssembly module, not a component: build it for wasm32-wasip2 (or run `wasm-tools component new`)"
    )]
    CoreModule { path: String },
    #[error("{path} is not a valid WebAssembly component: {message}")]
    Invalid { path: String, message: String },
    #[error(
        "{path} does not fit the inboxd:handler world: {message} (a handler exports `handle` and imports only inboxd:handler/{{types,sql,outbox,log}} and WASI 0.2 interfaces)"
    )]
    Link { path: String, message: String },
}

/// When a reused instance is replaced by a fresh one.
#[derive(Debug, Clone, Copy)]
pub struct Reuse {
    pub max_memory_bytes: usize,
    pub max_events: u32,
}

/// An instance kept between events, with its store.
pub struct HandlerComponent {
    name: Arc<str>,
    /// Handler and version, on every guest log line.
    tag: Arc<LogTag>,
    reuse: Option<Reuse>,
    /// Instances waiting for their next event (see [`super::warm`]).
    warm: WarmPool,
    version: String,
    pre: HandlerPre<StoreState>,
    engine: wasmtime::Engine,
    /// The engine's instance permits (see [`super::warm::slot`]).
    slots: Arc<tokio::sync::Semaphore>,
    limits: Limits,
    guard: Arc<Guard>,
    walls: Walls,
    outbox_topics: Arc<BTreeMap<String, String>>,
}

impl HandlerComponent {
    pub fn load(
        engine: &WasmEngine,
        name: &str,
        path: &Path,
        limits: Limits,
        guard: Guard,
        walls: Walls,
    ) -> Result<Self, LoadError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::from_bytes(engine, name, &shown, &bytes, limits, guard, walls)
    }

    pub fn from_bytes(
        engine: &WasmEngine,
        name: &str,
        shown: &str,
        bytes: &[u8],
        limits: Limits,
        guard: Guard,
        walls: Walls,
    ) -> Result<Self, LoadError> {
        let pre = link(engine, name, shown, bytes)?;
        let digest = Sha256::digest(bytes);
        let version: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
        Ok(Self {
            tag: Arc::new(LogTag {
                handler: name.to_owned(),
                version: version.clone(),
            }),
            reuse: None,
            warm: WarmPool::default(),
            outbox_topics: Arc::default(),
            guard: Arc::new(guard),
            walls,
            name: name.into(),
            version,
            pre,
            engine: engine.engine.clone(),
            slots: engine.slots.clone(),
            limits,
        })
    }

    /// Checks that `bytes` is a component of the `inboxd:handler` world that
    /// this host can run, compiling it (into the compile cache) on the way.
    pub fn check(engine: &WasmEngine, name: &str, shown: &str, bytes: &[u8]) -> Result<(), LoadError> {
        link(engine, name, shown, bytes).map(drop)
    }

    /// Labels the version recorded on inbox rows (default: the first 12 hex
    /// digits of the component's SHA-256; an uploaded version's number).
    pub fn with_version_label(mut self, version: String) -> Self {
        self.tag = Arc::new(LogTag {
            handler: self.name.to_string(),
            version: version.clone(),
        });
        self.version = version;
        self
    }
}

/// What a component imports and exports, by name: what `inboxd check` shows.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Interfaces {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

impl HandlerComponent {
    /// The names a component imports and exports (compiled, or taken from
    /// the compile cache: [`HandlerComponent::check`] put it there).
    pub fn interfaces(engine: &WasmEngine, shown: &str, bytes: &[u8]) -> Result<Interfaces, LoadError> {
        let (component, _) = super::cache::compile(engine, bytes).map_err(|e| LoadError::Invalid {
            path: shown.to_owned(),
            message: format!("{e:#}"),
        })?;
        let ty = component.component_type();
        Ok(Interfaces {
            imports: ty
                .imports(&engine.engine)
                .map(|(name, _)| name.to_owned())
                .collect(),
            exports: ty
                .exports(&engine.engine)
                .map(|(name, _)| name.to_owned())
                .collect(),
        })
    }
}

/// Compiles (or loads from the compile cache) and links a component.
fn link(
    engine: &WasmEngine,
    name: &str,
    shown: &str,
    bytes: &[u8],
) -> Result<HandlerPre<StoreState>, LoadError> {
    if is_core_module(bytes) {
        return Err(LoadError::CoreModule {
            path: shown.to_owned(),
        });
    }
    let started = std::time::Instant::now();
    let (component, cached) = super::cache::compile(engine, bytes).map_err(|e| LoadError::Invalid {
        path: shown.to_owned(),
        message: format!("{e:#}"),
    })?;
    let ms = started.elapsed().as_millis() as u64;
    if cached {
        tracing::info!(handler = name, ms, "component loaded from the compile cache");
    } else {
        tracing::info!(handler = name, ms, "component compiled");
    }
    let link = |e: wasmtime::Error| LoadError::Link {
        path: shown.to_owned(),
        message: format!("{e:#}"),
    };
    let instance_pre = engine.linker.instantiate_pre(&component).map_err(link)?;
    HandlerPre::new(instance_pre).map_err(link)
}

impl HandlerComponent {
    /// Maps the topic names the handler publishes to onto the deployment's real topics.
    pub fn with_outbox_topics(mut self, topics: BTreeMap<String, String>) -> Self {
        self.outbox_topics = Arc::new(topics);
        self
    }

    /// Keeps instances between events (`instances.reuse`).
    pub fn with_reuse(mut self, reuse: Option<Reuse>) -> Self {
        self.reuse = reuse;
        self
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// See [`Handler::version_label`](crate::handler::Handler::version_label).
    pub fn version_label(&self) -> &str {
        &self.version
    }

    /// Runs the guest for one event inside `tx`, for at most `budget` (at
    /// most `limits.timeout_ms`), and hands `tx` back.
    pub async fn invoke(
        &self,
        tx: Tx,
        record: &Record,
        event_id: &str,
        attempt: u32,
        budget: Duration,
    ) -> Invocation {
        let budget = budget.min(self.limits.timeout);
        let outbox = OutboxState::new(
            self.limits.max_outbox_messages,
            self.limits.max_outbox_bytes,
            self.outbox_topics.clone(),
            &record.headers,
        );
        let (mut store, warm_instance, events, slot) = match self.take_warm() {
            Some(mut warm) => {
                warm.store.data_mut().next_event(
                    tx,
                    self.guard.clone(),
                    &self.limits,
                    outbox,
                    self.tag.clone(),
                    event_id.to_owned(),
                );
                (warm.store, Some(warm.instance), warm.events, warm.slot)
            }
            None => {
                // A slot of the host's instance pool first, before the
                // event's deadline starts: waiting for one is not the
                // event's time (see `super::warm`).
                let Some(slot) = warm::slot(&self.slots, self.limits.timeout).await else {
                    return self.no_instance(tx);
                };
                let state = StoreState::new(
                    tx,
                    self.guard.clone(),
                    &self.limits,
                    outbox,
                    self.tag.clone(),
                    event_id.to_owned(),
                );
                let mut store = Store::new(&self.engine, state);
                store.limiter(|s| &mut s.limiter);
                // What one call may make the host copy out of the guest: no
                // more than its memory holds, nor than its limits let a call
                // carry (`handler::limits::hostcall_bytes`). Strings and list
                // elements may alias one buffer, so wasmtime's default of
                // 128 MiB let a guest of 16 MiB have each call copied eight
                // times over before any bound looked at it (the twenty-fourth
                // read), and its memory, 512 MiB a call (the forty-ninth).
                store.set_hostcall_fuel(self.limits.hostcall_bytes);
                // At every epoch tick the guest runs through, it yields to
                // the runtime until its deadline, where it traps: a guest in
                // a loop once held one of tokio's worker threads for its
                // whole timeout (up to 30 s), and a few of them every thread,
                // so every other team's pipeline, the relay and the admin
                // API stood still (the eighth read of this round, issue 23).
                store.epoch_deadline_callback(|ctx| {
                    Ok(if std::time::Instant::now() >= ctx.data().deadline {
                        wasmtime::UpdateDeadline::Interrupt
                    } else {
                        wasmtime::UpdateDeadline::Yield(1)
                    })
                });
                (store, None, 0, slot)
            }
        };
        let deadline = std::time::Instant::now() + budget;
        store.data_mut().deadline = deadline;
        store.data_mut().sql.set_deadline(deadline);
        store.set_epoch_deadline(1);
        let event = Event {
            id: event_id.to_owned(),
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
            key: record.key.clone(),
            payload: record.payload.clone(),
            headers: record.headers.clone(),
            timestamp_ms: record.timestamp_ms,
            attempt,
        };
        let outcome = {
            let call = async {
                let instance = match warm_instance {
                    Some(instance) => instance,
                    None => self.pre.instantiate_async(&mut store).await?,
                };
                let result = instance.call_handle(&mut store, &event).await?;
                Ok::<_, wasmtime::Error>((instance, result))
            };
            tokio::time::timeout(budget + BACKSTOP_GRACE, call).await
        };
        let state = store.data_mut();
        // On the event's span, when spans are exported (see `telemetry`).
        if crate::telemetry::tracing_on() {
            tracing::Span::current().record("sql_statements", state.sql.statements_run());
        }
        let mut tx = state.sql.take_tx();
        let mut host_error = state.sql.take_host_error();
        let sql_timed_out = state.sql.timed_out();
        let sql_out_of_memory = state.sql.exhausted().map(|(key, detail)| LimitExceeded {
            key,
            detail: detail.to_owned(),
        });
        // SQLite took the transaction with a failed statement for a reason
        // other than a limit (the database's disk full, an I/O error): whatever the guest
        // returned, its work is gone. Never commit that as applied; it is the
        // database's failure, the host's to retry. (Out of memory, or of
        // temporary disk, is a limit: retried as the database's, a statement
        // that always got there was retried for good: the twenty-second and
        // twenty-third reads.)
        if !sql_timed_out
            && sql_out_of_memory.is_none()
            && host_error.is_none()
            && tx.as_ref().is_some_and(Tx::is_lost)
        {
            host_error = Some(DbError::TransactionLost);
        }
        // (After the check above: this loss is the guest's, not the database's.)
        // The backstop fired: the call was stuck in a host function, on
        // PostgreSQL a statement that ignored `statement_timeout` (issue 23:
        // one `position()` ran for minutes, holding the event's claim). Its
        // backend is terminated and the transaction replaced, so neither the
        // host nor the event's next attempt waits on it.
        // On SQLite the statement is interrupted and waited for inside its
        // walls (see `Tx::abandon_stuck_call`). Only if a statement was
        // running: a guest that slept in WASI's `poll` left its transaction
        // idle and whole (the thirty-second read).
        if outcome.is_err()
            && state.sql.statement_running()
            && let Some(stuck) = tx.as_mut()
            && let Err(e) = stuck.abandon_stuck_call().await
        {
            host_error = Some(e);
        }
        // The pool refused the instance although the call held a slot (an
        // instance made outside the permits): the host's, like no slot.
        if let Ok(Err(error)) = &outcome
            && error
                .chain()
                .any(|c| c.is::<wasmtime::PoolConcurrencyLimitError>())
        {
            warm::release_all();
            host_error.get_or_insert(DbError::NoWasmInstance {
                waited: Duration::ZERO,
            });
        }
        let outbox = state.outbox.take();
        let stderr = self.forward_output(state, event_id);
        let (result, instance) = match outcome {
            Ok(Ok((instance, Ok(())))) => (Ok(()), Some(instance)),
            Ok(Ok((instance, Err(HandlerError::Retry(m))))) => {
                (Err(GuestFailure::Retry(bounded(m))), Some(instance))
            }
            Ok(Ok((instance, Err(HandlerError::Reject(m))))) => {
                (Err(GuestFailure::Reject(bounded(m))), Some(instance))
            }
            Ok(Err(error)) => (Err(self.classify_trap(state, &error, &stderr)), None),
            Err(_elapsed) => (Err(GuestFailure::Limit(self.timeout_exceeded())), None),
        };
        // A statement stopped at the deadline means the event ran out of
        // time, whatever the guest made of the error it got: the time limit
        // is what failed, and like any limit it counts against the attempts.
        let (result, instance) = match (sql_timed_out, sql_out_of_memory, result) {
            (true, _, Ok(()) | Err(GuestFailure::Retry(_) | GuestFailure::Reject(_))) => {
                (Err(GuestFailure::Limit(self.timeout_exceeded())), None)
            }
            (false, Some(limit), Ok(()) | Err(GuestFailure::Retry(_) | GuestFailure::Reject(_))) => {
                (Err(GuestFailure::Limit(limit)), None)
            }
            (_, _, result) => (result, instance),
        };
        // Only an instance that returned normally is kept: after a trap or a
        // limit its state is suspect, and the next event gets a fresh one.
        if let (Some(instance), None) = (instance, &host_error) {
            self.keep_warm(Warm {
                store,
                instance,
                events: events + 1,
                slot,
            });
        } else {
            // The store first: it gives its instance back to the pool
            // before the permit lets the next call make one.
            drop(store);
            drop(slot);
        }
        Invocation {
            tx,
            result,
            host_error,
            outbox,
        }
    }

    /// The event's call when no slot of the instance pool came free within
    /// the handler's timeout: the host's failure, retried with its batch,
    /// never counted against the event.
    fn no_instance(&self, tx: Tx) -> Invocation {
        tracing::warn!(
            handler = &*self.name,
            waited_ms = self.limits.timeout.as_millis() as u64,
            "every Wasm instance of the host stayed in use; the event will be retried"
        );
        Invocation {
            tx: Some(tx),
            result: Ok(()),
            host_error: Some(DbError::NoWasmInstance {
                waited: self.limits.timeout,
            }),
            outbox: Vec::new(),
        }
    }

    fn take_warm(&self) -> Option<Warm> {
        self.reuse?;
        self.warm.take()
    }

    fn keep_warm(&self, warm: Warm) {
        let Some(reuse) = self.reuse else { return };
        let memory = warm.store.data().limiter.total_bytes();
        // Not one whose memory limit fired (a guest that handled a failed
        // `memory.grow`): the flag would outlive the event and name every
        // later trap of the instance a memory limit (the thirty-second read).
        if warm.store.data().limiter.exceeded().is_some() {
            return;
        }
        if memory > reuse.max_memory_bytes || warm.events >= reuse.max_events {
            tracing::debug!(
                handler = &*self.name,
                memory,
                events = warm.events,
                "recycling a reused instance"
            );
            return;
        }
        // Not while the pool has no instance free: an idle one would hold a
        // slot a call of another handler may be waiting for.
        if self.slots.available_permits() == 0 {
            return;
        }
        self.warm.keep(warm);
    }

    fn timeout_exceeded(&self) -> LimitExceeded {
        LimitExceeded {
            key: "limits.timeout_ms",
            detail: format!(
                "the handler ran longer than {} ms",
                self.limits.timeout.as_millis()
            ),
        }
    }

    fn classify_trap(&self, state: &StoreState, error: &wasmtime::Error, stderr: &str) -> GuestFailure {
        // A failed memory.grow usually surfaces as a generic trap (an allocator
        // abort), so the limiter's record is checked first.
        if let Some(exceeded) = state.limiter.exceeded() {
            return GuestFailure::Limit(exceeded.clone());
        }
        if error.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
            return GuestFailure::Limit(self.timeout_exceeded());
        }
        let mut cause = match error.downcast_ref::<Trap>() {
            Some(trap) => trap.to_string(),
            None => format!("{error:#}"),
        };
        if cause.contains("resource table has no free keys") {
            cause.push_str(&format!(
                " (a handler holds at most {} WASI resources at once: streams, pollables; drop them)",
                super::state::MAX_RESOURCES
            ));
        }
        let stderr = stderr.trim();
        if stderr.is_empty() {
            GuestFailure::Trap(bounded(cause))
        } else {
            GuestFailure::Trap(bounded(format!("{cause}; guest stderr: {stderr}")))
        }
    }

    /// Copies the guest's captured stdout/stderr into the host log; returns stderr.
    fn forward_output(&self, state: &mut StoreState, event_id: &str) -> String {
        let (handler, version) = (&*self.name, self.version.as_str());
        let (stdout, stdout_dropped) = state.stdout.take();
        let (stderr, stderr_dropped) = state.stderr.take();
        for (stream, text, dropped) in [
            ("stdout", &stdout, stdout_dropped),
            ("stderr", &stderr, stderr_dropped),
        ] {
            if !text.is_empty() {
                tracing::info!(target: "guest", handler, version, event_id, stream, "{}", text.trim_end());
            }
            if dropped > 0 {
                tracing::warn!(
                    target: "guest", handler, version, event_id, stream, dropped,
                    "guest output past limits.output_bytes was dropped"
                );
            }
        }
        let dropped_lines = state.log.dropped_lines();
        if dropped_lines > 0 {
            tracing::warn!(target: "guest", handler, version, event_id, dropped_lines, "guest log lines past limits.output_bytes were dropped");
        }
        stderr
    }
}

/// A core module's preamble is `\0asm` then version 1, layer 0; a component's
/// has a different version and layer, so the two can be told apart up front.
fn is_core_module(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\0asm") && bytes.get(4..8) == Some(&[1, 0, 0, 0])
}

/// A guest's reason, cut to [`MAX_REASON_BYTES`] into a buffer of its own:
/// `truncate` keeps the whole allocation, and a retried event's reason is
/// held through its backoff (a 125 MB reason held 120 MB per waiting event,
/// the review of issue 23's compile worker).
fn bounded(text: String) -> String {
    if text.len() <= MAX_REASON_BYTES {
        return text;
    }
    let mut cut = MAX_REASON_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut short = String::with_capacity(cut + 3);
    short.push_str(&text[..cut]);
    short.push_str("...");
    short
}

impl crate::handler::Handler for HandlerComponent {
    fn name(&self) -> &str {
        HandlerComponent::name(self)
    }

    fn version_label(&self) -> &str {
        HandlerComponent::version_label(self)
    }

    fn max_payload_bytes(&self) -> usize {
        self.limits.max_payload_bytes
    }

    fn walls(&self) -> &Walls {
        &self.walls
    }

    fn invoke<'a>(
        &'a self,
        tx: Tx,
        record: &'a Record,
        event_id: &'a str,
        attempt: u32,
        budget: std::time::Duration,
    ) -> futures_util::future::BoxFuture<'a, Invocation> {
        Box::pin(HandlerComponent::invoke(
            self, tx, record, event_id, attempt, budget,
        ))
    }

    fn timeout(&self) -> std::time::Duration {
        self.limits.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long reason keeps only its cut: the guest's string is not held
    /// through a retry's backoff.
    #[test]
    fn a_long_reason_is_cut_into_a_buffer_of_its_own() {
        let cut = bounded("é".repeat(1 << 20));
        assert!(
            cut.ends_with("...") && cut.len() <= MAX_REASON_BYTES + 3,
            "{}",
            cut.len()
        );
        assert!(cut.capacity() <= MAX_REASON_BYTES + 3, "{}", cut.capacity());
        assert_eq!(bounded("short".to_owned()), "short");
    }
}
