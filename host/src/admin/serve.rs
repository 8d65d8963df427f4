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
//! connection waits that long for the next), the connections open are
//! bounded ([`connections`](super::connections): at a bound a newcomer
//! takes the place of the connection that has waited longest on its
//! client), and a connection whose writes make no progress for
//! [`SEND_STALL`] is closed.

use super::connections::{Admission, Connections, Marker};
use axum::Router;
use hyper::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long a request's head may take to arrive.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(30);
/// How long a connection's writes may make no progress.
pub const SEND_STALL: Duration = Duration::from_secs(60);
/// hyper's read buffer per connection, at most: a request's head fits
/// (a body beyond it is read in pieces).
const READ_BUFFER: usize = 64 << 10;
/// How long a stopping server waits for the requests it is serving.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown`. A connection that cannot be
/// admitted is accepted and closed at once (left in the kernel's backlog,
/// it kept every later one waiting, probes included).
pub async fn serve(listener: TcpListener, app: Router, shutdown: CancellationToken) {
    let open = Arc::new(Connections::default());
    let mut logged: Option<Instant> = None;
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
        let connection = match open.admit(peer.ip()) {
            Admission::Admitted { connection, closed } => {
                if let Some(closed) = closed
                    && logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(60))
                {
                    logged = Some(Instant::now());
                    tracing::warn!(
                        %peer,
                        "the admin API is full: it closed the connection of {closed:?} that waited \
                         longest on its client (logged once a minute)"
                    );
                }
                connection
            }
            Admission::Refused => {
                if logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                    logged = Some(Instant::now());
                    tracing::warn!(
                        %peer,
                        "the admin API closed a new connection: every connection in its way is \
                         serving a request (logged once a minute)"
                    );
                }
                drop(stream);
                continue;
            }
        };
        let io = TokioIo::new(Stalls::new(stream, SEND_STALL));
        let service = Marked {
            inner: TowerToHyperService::new(app.clone()),
            marker: connection.marker(),
        };
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_DEADLINE)
                .max_buf_size(READ_BUFFER);
            let served = builder.serve_connection(io, service);
            tokio::pin!(served);
            tokio::select! {
                _ = served.as_mut() => return,
                // Its place went to a newcomer: closed now.
                _ = connection.closed() => return,
                _ = shutdown.cancelled() => served.as_mut().graceful_shutdown(),
            }
            let _ = served.await;
        });
    }
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN, drained).await.is_err() {
        tracing::warn!("admin API requests still running after {DRAIN:?} were cut off");
    }
}

/// The app, each request carrying its connection's [`Marker`]: the request
/// marks its connection serving once it holds a place (`responses.rs`), not
/// while it waits for one (a connection whose requests all wait, pipelined
/// one after another, would never be closed for a newcomer: the
/// twenty-third read).
struct Marked {
    inner: TowerToHyperService<Router>,
    marker: Marker,
}

impl hyper::service::Service<Request<Incoming>> for Marked {
    type Response = <TowerToHyperService<Router> as hyper::service::Service<Request<Incoming>>>::Response;
    type Error = <TowerToHyperService<Router> as hyper::service::Service<Request<Incoming>>>::Error;
    type Future = <TowerToHyperService<Router> as hyper::service::Service<Request<Incoming>>>::Future;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.marker.clone());
        self.inner.call(request)
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

    /// Four addresses holding every connection open, idle (the twenty-first
    /// read) or with requests waiting for a place (the twenty-third), do not
    /// shut out a probe from a fifth: it takes the place of the connection
    /// that waited longest, and is answered.
    #[tokio::test]
    async fn idle_connections_filling_the_bounds_do_not_shut_out_a_probe() {
        use super::super::connections::{MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER};
        use tokio::io::AsyncReadExt;
        use tokio::net::TcpSocket;

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // `/wait`: a request that never gets a place (it waits, unmarked).
        let app = Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .route("/wait", axum::routing::get(std::future::pending::<&'static str>));
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app, shutdown.clone()));
        let connect_from = |from: &str| {
            let from: std::net::SocketAddr = format!("{from}:0").parse().unwrap();
            async move {
                let socket = TcpSocket::new_v4().unwrap();
                socket.bind(from).unwrap();
                socket.connect(addr).await.unwrap()
            }
        };
        // Half idle, half with a request waiting for a place (the
        // twenty-third read: those were marked serving and never closed).
        let mut idle = Vec::new();
        for i in 0..MAX_CONNECTIONS {
            let from = format!("127.0.0.{}", 2 + i / MAX_CONNECTIONS_PER_PEER);
            let mut connection = connect_from(&from).await;
            if i % 2 == 1 {
                connection
                    .write_all(b"GET /wait HTTP/1.1\r\nhost: x\r\n\r\n")
                    .await
                    .unwrap();
            }
            idle.push(connection);
        }
        // Let the server admit them all before the probe comes.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut probe = connect_from("127.0.0.9").await;
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), probe.read_to_end(&mut answer))
            .await
            .expect("answered in time")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // The first idle connection (the longest waiting) was closed for it.
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), idle[0].read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed: {read:?}");
        shutdown.cancel();
        drop(idle);
        server.await.unwrap();
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
