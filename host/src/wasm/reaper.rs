//! Dropping spent stores off the event's path.
//!
//! Dropping a store returns its instance's slot to the pooling allocator: the
//! kept-resident prefix of its memory is zeroed and the rest decommitted
//! (`madvise`, with a cross-core TLB shootdown). That was 9% of the host's
//! CPU in a profile of the benchmark's mode (a) on SQLite, all of it inside
//! the single writer's transaction, where nothing else can run. A thread of
//! its own does it instead, on the core the writer leaves idle. (Only on
//! SQLite: see `HandlerComponent::retire` for why not on PostgreSQL.)
//!
//! The queue is short and never waited on: when it is full the store is
//! dropped where it is, as before. So at most [`QUEUE`] spent instances hold
//! a slot beyond those running, far inside the pool's bounds (`engine.rs`),
//! and a slow reaper costs time, never a failed instantiation.

use super::state::StoreState;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use wasmtime::Store;

/// Spent stores waiting to be dropped, at most.
const QUEUE: usize = 32;

/// Generic only so that a test can watch where its values are dropped.
pub(crate) struct Reaper<T: Send + 'static = Store<StoreState>> {
    queue: SyncSender<T>,
}

impl<T: Send + 'static> Clone for Reaper<T> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
        }
    }
}

impl<T: Send + 'static> Reaper<T> {
    /// Starts the thread; it ends when the last `Reaper` (clone) is dropped.
    pub fn spawn() -> Self {
        let (queue, spent) = sync_channel::<T>(QUEUE);
        std::thread::Builder::new()
            .name("inboxd-reaper".into())
            .spawn(move || {
                for value in spent {
                    drop(value);
                }
            })
            .expect("spawning the store reaper thread");
        Self { queue }
    }

    /// Drops `spent` on the reaper's thread, or here if its queue is full.
    pub fn drop_later(&self, spent: T) {
        match self.queue.try_send(spent) {
            Ok(()) => {}
            Err(TrySendError::Full(spent) | TrySendError::Disconnected(spent)) => drop(spent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{Receiver, Sender, channel};
    use std::time::Duration;

    /// Reports the name of the thread that drops it; with a gate, says it
    /// began dropping and waits for the gate to open first.
    struct Watched {
        dropped_on: Sender<Option<String>>,
        gate: Option<(Sender<()>, Receiver<()>)>,
    }

    impl Drop for Watched {
        fn drop(&mut self) {
            if let Some((began, gate)) = &self.gate {
                let _ = began.send(());
                let _ = gate.recv_timeout(Duration::from_secs(10));
            }
            let name = std::thread::current().name().map(str::to_owned);
            let _ = self.dropped_on.send(name);
        }
    }

    #[test]
    fn spent_values_are_dropped_on_the_reaper_thread_and_in_place_when_it_lags() {
        let reaper = Reaper::<Watched>::spawn();
        let (dropped_on, drops) = channel();
        let here = std::thread::current().name().map(str::to_owned);
        let wait = Duration::from_secs(10);

        reaper.drop_later(Watched {
            dropped_on: dropped_on.clone(),
            gate: None,
        });
        assert_eq!(
            drops.recv_timeout(wait).unwrap().as_deref(),
            Some("inboxd-reaper")
        );

        // Hold the reaper in one drop, fill its queue, and one more is dropped here.
        let (open, gate) = channel();
        let (began, reaper_busy) = channel();
        reaper.drop_later(Watched {
            dropped_on: dropped_on.clone(),
            gate: Some((began, gate)),
        });
        reaper_busy.recv_timeout(wait).unwrap();
        for _ in 0..=QUEUE {
            reaper.drop_later(Watched {
                dropped_on: dropped_on.clone(),
                gate: None,
            });
        }
        assert_eq!(
            drops.recv_timeout(wait).unwrap(),
            here,
            "a full queue drops in place"
        );
        open.send(()).unwrap();
        // The held one, then the queued ones.
        for _ in 0..=QUEUE {
            let name = drops.recv_timeout(wait).unwrap();
            assert_eq!(name.as_deref(), Some("inboxd-reaper"));
        }
    }
}
