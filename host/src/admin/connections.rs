//! Which connections the admin API keeps open when it is full.
//!
//! The API keeps at most [`MAX_CONNECTIONS`] connections, at most
//! [`MAX_CONNECTIONS_PER_PEER`] from one peer. Closing the newcomer at a
//! bound let a client with four addresses (an IPv6 /64 has billions, and a
//! proxy is one address for all its clients) fill both bounds with idle
//! keep-alive connections and shut out every other client, the
//! orchestrator's probes included (issue 23, the twenty-first read). So at
//! a bound a newcomer takes the place of the connection that has waited
//! longest on its client: an idle keep-alive connection, or one whose
//! request head has not arrived, or whose request waits for a place. A
//! connection serving a request (from when the request holds its place, or
//! is an admin token's, until its response's last piece is handed over) is
//! never closed for another; how many can be at once is bounded by the
//! places (`responses.rs`: 8 per team token, 32 for requests without a
//! known one). A request still waiting for its place does not count: then
//! pipelined requests, each waiting its 10 s and answered 503, kept every
//! connection serving (the twenty-third read). A client that keeps
//! reconnecting closes its own oldest connections first, since a newcomer
//! is the last to be chosen.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Connections open at once, at most.
pub const MAX_CONNECTIONS: usize = 256;
/// Connections open at once from one peer (an IPv4 address or an IPv6 /64),
/// at most: one client's reconnects close its own connections, not
/// everyone's. A TLS proxy in front is one peer for all its clients, so
/// this is well above what a console and a few scripts use.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;

/// Where a connection comes from, as the per-peer bound counts it: an IPv4
/// address (also written as IPv6), or an IPv6 /64 (one host's share of
/// addresses on most networks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer(IpAddr);

impl Peer {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Peer(ip),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Peer(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !u128::from(u64::MAX);
                    Peer(IpAddr::V6(Ipv6Addr::from(prefix)))
                }
            },
        }
    }
}

/// The open connections.
#[derive(Default)]
pub struct Connections(Mutex<Open>);

#[derive(Default)]
struct Open {
    next_id: u64,
    by_id: HashMap<u64, Entry>,
    per_peer: HashMap<Peer, usize>,
}

struct Entry {
    peer: Peer,
    /// Requests being served (at most one on HTTP/1, whose requests take turns).
    serving: usize,
    /// Since when it has waited on its client (none while serving).
    waiting_since: Instant,
    close: CancellationToken,
}

/// What admitting a connection did.
pub enum Admission {
    /// Admitted; `closed` is the peer of a connection closed for it, if any.
    Admitted {
        connection: Connection,
        closed: Option<Peer>,
    },
    /// Every connection in the way is serving a request: the newcomer is closed.
    Refused,
}

impl Connections {
    /// Admits a connection from `ip`, closing for it, at a bound, the one
    /// that has waited longest on its client (of its own peer at the
    /// per-peer bound, of all at the total one).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Admission {
        let peer = Peer::of(ip);
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut closed = None;
        let own = open.per_peer.get(&peer).copied().unwrap_or(0);
        let full = if own >= MAX_CONNECTIONS_PER_PEER {
            Some(Some(peer))
        } else if open.by_id.len() >= MAX_CONNECTIONS {
            Some(None)
        } else {
            None
        };
        if let Some(among) = full {
            let victim = open
                .by_id
                .iter()
                .filter(|(_, e)| e.serving == 0 && among.is_none_or(|p| e.peer == p))
                .min_by_key(|(id, e)| (e.waiting_since, **id))
                .map(|(id, _)| *id);
            let Some(victim) = victim else {
                return Admission::Refused;
            };
            if let Some(entry) = open.remove(victim) {
                entry.close.cancel();
                closed = Some(entry.peer);
            }
        }
        let id = open.next_id;
        open.next_id += 1;
        let close = CancellationToken::new();
        open.by_id.insert(
            id,
            Entry {
                peer,
                serving: 0,
                waiting_since: Instant::now(),
                close: close.clone(),
            },
        );
        *open.per_peer.entry(peer).or_default() += 1;
        Admission::Admitted {
            connection: Connection {
                id,
                connections: self.clone(),
                close,
            },
            closed,
        }
    }

    fn with_entry(&self, id: u64, change: impl FnOnce(&mut Entry)) {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = open.by_id.get_mut(&id) {
            change(entry);
        }
    }

    #[cfg(test)]
    fn count(&self) -> usize {
        self.0.lock().unwrap().by_id.len()
    }
}

impl Open {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.by_id.remove(&id)?;
        if let Some(count) = self.per_peer.get_mut(&entry.peer) {
            *count -= 1;
            if *count == 0 {
                self.per_peer.remove(&entry.peer);
            }
        }
        Some(entry)
    }
}

/// An admitted connection's place, given back when dropped.
pub struct Connection {
    id: u64,
    connections: Arc<Connections>,
    close: CancellationToken,
}

impl Connection {
    /// Resolves when another connection took this one's place.
    pub fn closed(&self) -> WaitForCancellationFutureOwned {
        self.close.clone().cancelled_owned()
    }

    /// A handle that marks the connection serving a request while it lives.
    pub fn marker(&self) -> Marker {
        Marker {
            id: self.id,
            connections: self.connections.clone(),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut open = self.connections.0.lock().unwrap_or_else(|p| p.into_inner());
        open.remove(self.id);
    }
}

/// Makes [`Serving`] guards for one connection.
#[derive(Clone)]
pub struct Marker {
    id: u64,
    connections: Arc<Connections>,
}

impl Marker {
    /// The connection is serving a request until the guard is dropped.
    pub fn serving(&self) -> Serving {
        self.connections.with_entry(self.id, |e| e.serving += 1);
        Serving(self.clone())
    }
}

/// A request being served (see [`Marker::serving`]).
pub struct Serving(Marker);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.connections.with_entry(self.0.id, |e| {
            e.serving -= 1;
            if e.serving == 0 {
                e.waiting_since = Instant::now();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(connections: &Arc<Connections>, ip: &str) -> Connection {
        match connections.admit(ip.parse().unwrap()) {
            Admission::Admitted { connection, .. } => connection,
            Admission::Refused => panic!("{ip} refused"),
        }
    }

    /// At the total bound a newcomer closes the connection that has waited
    /// longest on its client; one serving a request is never chosen, and
    /// when all are serving the newcomer is refused.
    #[test]
    fn a_newcomer_takes_the_place_of_the_longest_waiting_connection() {
        let connections = Arc::new(Connections::default());
        let held: Vec<Connection> = (0..MAX_CONNECTIONS)
            .map(|i| admit(&connections, &format!("10.0.{}.{}", i / 60, i % 60)))
            .collect();
        // The oldest serves a request: the second oldest is closed instead.
        let serving = held[0].marker().serving();
        let Admission::Admitted {
            connection: newcomer,
            closed,
        } = connections.admit("10.9.9.9".parse().unwrap())
        else {
            panic!("refused")
        };
        assert_eq!(closed, Some(Peer::of("10.0.0.1".parse().unwrap())));
        assert!(held[1].close.is_cancelled() && !held[0].close.is_cancelled());
        assert_eq!(connections.count(), MAX_CONNECTIONS);
        drop(serving);

        // Every one serving: refused, and nothing closed.
        let all: Vec<Serving> = held
            .iter()
            .chain([&newcomer])
            .map(|c| c.marker().serving())
            .collect();
        assert!(matches!(
            connections.admit("10.9.9.8".parse().unwrap()),
            Admission::Refused
        ));
        assert_eq!(connections.count(), MAX_CONNECTIONS);
        // Served: waiting again, so closable again.
        drop(all);
        let last = admit(&connections, "10.9.9.8");
        drop((held, newcomer));
        assert_eq!(connections.count(), 1, "only the last one");
        drop(last);
        assert_eq!(connections.count(), 0);
    }

    /// At a peer's bound the newcomer closes that peer's own oldest
    /// connection, not another peer's; an IPv6 /64 is one peer, and an
    /// IPv4 address written as IPv6 is that address.
    #[test]
    fn a_peer_at_its_bound_closes_its_own_oldest_connection() {
        let connections = Arc::new(Connections::default());
        let other = admit(&connections, "10.1.1.1");
        let own: Vec<Connection> = (0..MAX_CONNECTIONS_PER_PEER)
            .map(|i| admit(&connections, &format!("2001:db8::{:x}", i + 1)))
            .collect();
        let Admission::Admitted {
            connection: _newcomer,
            closed,
        } = connections.admit("2001:db8::ffff:1".parse().unwrap())
        else {
            panic!("refused")
        };
        assert_eq!(closed, Some(Peer::of("2001:db8::".parse().unwrap())));
        assert!(own[0].close.is_cancelled(), "its own oldest");
        assert!(!other.close.is_cancelled(), "not another peer's");
        let _next_net = admit(&connections, "2001:db8:0:1::1");
        assert_eq!(
            Peer::of("::ffff:10.1.1.1".parse().unwrap()),
            Peer::of("10.1.1.1".parse().unwrap())
        );
        drop(own);
        assert_eq!(connections.count(), 3);
    }
}
