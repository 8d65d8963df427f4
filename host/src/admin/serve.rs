//! The admin API's connections: how many, and how long each may stall.
//!
//! `axum::serve` gave hyper no timer, so its header-read timeout did
//! nothing, capped no connection and had no write deadline: anyone who
//! reaches the port held connections (and a read buffer each) for good,
//! sending a byte of a header a minute, until accepting failed for every
//! file descriptor of the process (new database connections, the broker's
//! reconnects); and a client that read none of a large response kept it in
//! hyper's write buffer for as long as its connection stayed open (issue 23,
//! the nineteenth read). Here hyper serves each connection with a timer: a
//! request's head must arrive within [`HEAD_DEADLINE`] (an idle keep-alive
//! connection waits that long for the next), at most [`MAX_CONNECTIONS`]
//! connections are open, [`MAX_CONNECTIONS_PER_PEER`] from one address
//! (the next is closed at once), and a connection whose writes make no
//! progress for [`SEND_STALL`] is closed.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Connections open at once, at most.
pub const MAX_CONNECTIONS: usize = 256;
/// Connections open at once from one address, at most: one client cannot
/// take them all (keeping idle keep-alive connections alive with a request
/// every 25 s took every place, and the orchestrator's probes with them:
/// the twentieth read). A TLS proxy in front is one address for all its
/// clients, so this is well above what a console and a few scripts use.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;
/// How long a request's head may take to arrive.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(30);
/// How long a connection's writes may make no progress.
pub const SEND_STALL: Duration = Duration::from_secs(60);
/// hyper's read buffer per connection, at most: a request's head fits
/// (a body beyond it is read in pieces).
const READ_BUFFER: usize = 64 << 10;
/// How long a stopping server waits for the requests it is serving.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown`. A connection past either
/// bound is accepted and closed at once (left in the kernel's backlog, it
/// kept every later one waiting, probes included).
pub async fn serve(listener: TcpListener, app: Router, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let peers: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    let mut refused_logged: Option<Instant> = None;
    let mut connections = JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!("the admin API could not accept a connection: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let admitted = slots
            .clone()
            .try_acquire_owned()
            .ok()
            .and_then(|slot| PeerSlot::take(&peers, peer.ip()).map(|peer| (slot, peer)));
        let Some((slot, peer_slot)) = admitted else {
            if refused_logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                refused_logged = Some(Instant::now());
                tracing::warn!(
                    %peer,
                    "the admin API closed a connection past its bounds ({MAX_CONNECTIONS} open, \
                     {MAX_CONNECTIONS_PER_PEER} from one address; logged once a minute)"
                );
            }
            drop(stream);
            continue;
        };
        let io = TokioIo::new(Stalls::new(stream, SEND_STALL));
        let service = TowerToHyperService::new(app.clone());
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _slots = (slot, peer_slot);
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_DEADLINE)
                .max_buf_size(READ_BUFFER);
            let connection = builder.serve_connection(io, service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = shutdown.cancelled() => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
    }
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN, drained).await.is_err() {
        tracing::warn!("admin API requests still running after {DRAIN:?} were cut off");
    }
}

/// One of an address's connections, given back when dropped.
struct PeerSlot {
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PeerSlot {
    fn take(peers: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr) -> Option<Self> {
        let mut open = peers.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(ip).or_default();
        if *count >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *count += 1;
        Some(Self {
            peers: peers.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// A connection whose writes fail once they have made no progress for `limit`.
struct Stalls {
    io: TcpStream,
    limit: Duration,
    /// Since when writes have been waiting, as a timer.
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Stalls {
    fn new(io: TcpStream, limit: Duration) -> Self {
        Self {
            io,
            limit,
            waiting: None,
        }
    }

    /// After a write that could not go on: an error once it has waited `limit`.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let timer = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn wrote<T>(&mut self, written: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match written {
            Poll::Ready(done) => {
                self.waiting = None;
                Poll::Ready(done)
            }
            Poll::Pending => self.stalled(cx),
        }
    }
}

impl AsyncRead for Stalls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stalls {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(written, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(written, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.io).poll_flush(cx);
        self.wrote(flushed, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// One address has at most its share of connections, and gets them
    /// back as they close; another address has its own.
    #[test]
    fn an_address_has_its_share_of_connections() {
        let peers: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
        let (one, two): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut held: Vec<PeerSlot> = (0..MAX_CONNECTIONS_PER_PEER)
            .map(|_| PeerSlot::take(&peers, one).expect("within the share"))
            .collect();
        assert!(PeerSlot::take(&peers, one).is_none(), "past the share");
        assert!(PeerSlot::take(&peers, two).is_some(), "another address");
        held.pop();
        assert!(PeerSlot::take(&peers, one).is_some(), "given back");
        drop(held);
        assert!(peers.lock().unwrap().is_empty(), "nothing left behind");
    }

    /// A peer that reads nothing stalls the writes, which then fail at the
    /// limit instead of waiting for good.
    #[tokio::test]
    async fn writes_to_a_peer_that_reads_nothing_fail_at_the_limit() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let mut stalls = Stalls::new(stream, Duration::from_millis(300));
        let chunk = vec![0u8; 1 << 20];
        let error = loop {
            if let Err(error) = stalls.write_all(&chunk).await {
                break error;
            }
        };
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
        drop(peer);
    }
}
