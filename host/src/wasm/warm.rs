//! Idle instances kept for reuse (`instances.reuse`), and their share of the
//! one pool every handler's instances come from.
//!
//! Each idle instance holds a slot of the pooling allocator
//! (`wasm.instances` for the whole host, 256 by default). Regression (the
//! thirty-second adversarial read, issue 23): handlers that reuse
//! instances kept every one that ended cleanly, for good, and when the
//! pool was full every other handler's instantiation failed at once, and
//! its events were parked as traps. So a handler keeps at most
//! [`MAX_WARM`], and a full pool sends every handler's idle instances back
//! ([`release_all`]) while the call that found it full waits its turn.
//!
//! The pool's slots are handed out as permits ([`slot`]), first come first
//! served, before an instance is made and before the event's deadline
//! starts. Regression (the thirty-third read): a call that found the pool
//! full waited inside its own deadline, so under a pool that stayed full it
//! ended as the event's time limit (counted against the event, which was
//! not at fault) and the backstop then terminated a backend that had run
//! no SQL. Now a call that gets no slot within its handler's timeout fails
//! as the host's (`DbError::NoWasmInstance`): the batch is retried and the
//! event's attempts are not touched.
//!
//! Since the forty-fourth read the pool holds every handler's calls at once
//! (`config::instances_short`, checked at start, upload and load), so only
//! idle instances can fill it, and none is kept while it is full: the wait
//! above is a safety net, not a queue one handler can keep another in.

use super::state::StoreState;
use crate::bindings::Handler as Instance;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::Store;

/// Idle instances one handler version keeps, at most.
pub(super) const MAX_WARM: usize = 4;

/// An instance between two events.
pub(super) struct Warm {
    // Declared before `slot`, so it is dropped first: the store returns its
    // slot to the pool before the permit lets the next call take it.
    pub store: Store<StoreState>,
    pub instance: Instance,
    pub events: u32,
    pub slot: Slot,
}

/// The right to one of the pool's component instances, held for as long as
/// the instance lives (running or idle).
pub(super) type Slot = OwnedSemaphorePermit;

/// A slot of the pool (`slots`: one permit per instance it holds, the
/// engine's), waiting at most `wait`. When none is free, every handler's
/// idle instances go back first. Tokio's semaphore is fair: calls get their
/// slots in the order they asked, so no handler, however many calls it has
/// in flight, keeps another waiting longer than the calls queued before it
/// take. `None`: the pool stayed full for `wait`.
pub(super) async fn slot(slots: &Arc<Semaphore>, wait: Duration) -> Option<Slot> {
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return Some(slot);
    }
    release_all();
    tokio::time::timeout(wait, slots.clone().acquire_owned())
        .await
        .ok()?
        .ok()
}

/// What [`release_all`] can empty.
trait Release: Send + Sync {
    fn release(&self);
}

impl<T: Send> Release for Mutex<Vec<T>> {
    fn release(&self) {
        // Dropped outside the lock: a store's drop returns its slots.
        let idle = std::mem::take(&mut *self.lock().unwrap_or_else(|p| p.into_inner()));
        drop(idle);
    }
}

/// Every handler version's idle instances, to send back when the pool is full.
static ALL: Mutex<Vec<Weak<dyn Release>>> = Mutex::new(Vec::new());

/// One handler version's idle instances.
pub(super) struct WarmPool<T = Warm>(Arc<Mutex<Vec<T>>>);

impl<T: Send + 'static> Default for WarmPool<T> {
    fn default() -> Self {
        let kept = Arc::new(Mutex::new(Vec::new()));
        let registered: Arc<dyn Release> = kept.clone();
        let mut all = ALL.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&registered));
        Self(kept)
    }
}

impl<T> WarmPool<T> {
    pub fn take(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    /// Keeps `warm` unless [`MAX_WARM`] are kept already.
    pub fn keep(&self, warm: T) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < MAX_WARM {
            kept.push(warm);
        }
    }
}

/// Drops every handler's idle instances, freeing their slots of the pool.
pub(super) fn release_all() {
    let pools: Vec<Arc<dyn Release>> = {
        let all = ALL.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().filter_map(Weak::upgrade).collect()
    };
    for pool in pools {
        pool.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that finds the pool full sends every idle instance back and
    /// then waits its turn; one that gets none within its wait is told so
    /// (the host's failure, retried), and the next permit goes to it.
    #[tokio::test]
    async fn a_full_pool_frees_idle_instances_then_says_none_came() {
        let slots = Arc::new(Semaphore::new(1));
        let idle = WarmPool::<Slot>::default();
        idle.keep(slots.clone().try_acquire_owned().unwrap());
        let freed = slot(&slots, Duration::from_millis(10)).await;
        assert!(freed.is_some(), "the idle instance's slot was sent back");
        assert!(slot(&slots, Duration::from_millis(10)).await.is_none());
        drop(freed);
        assert!(slot(&slots, Duration::from_millis(10)).await.is_some());
    }

    /// A handler keeps at most `MAX_WARM` idle instances, and a full pool
    /// empties every handler's, not only the one that found it full.
    #[test]
    fn idle_instances_are_bounded_and_all_go_back_when_the_pool_is_full() {
        let (a, b) = (WarmPool::<u32>::default(), WarmPool::<u32>::default());
        for n in 0..10 {
            a.keep(n);
        }
        b.keep(99);
        assert_eq!(a.0.lock().unwrap().len(), MAX_WARM);
        release_all();
        assert_eq!((a.take(), b.take()), (None, None));
        drop(b);
        a.keep(1);
        release_all();
        assert_eq!(a.take(), None, "a dropped pool is skipped");
    }
}
