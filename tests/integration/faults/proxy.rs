//! A TCP proxy between a host and one of its services, which a test tells
//! to fail the way networks do (issue 27): cut every connection and refuse
//! new ones, blackhole (accept, never answer), or, for
//! PostgreSQL, drop the acknowledgement of a `COMMIT`: the transaction
//! committed, and the host never hears so.
//!
//! It listens on 127.0.0.1 only. Every connection lives in one epoch of the
//! proxy's mode: any change of mode ends it (a cut at once; a blackhole
//! first freezes it, and closes it when the blackhole ends, as a peer's
//! timeout would). Dropping the proxy ends every task it started.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the proxy does to connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Bytes pass.
    Pass,
    /// Every connection is closed, and new ones are closed as they arrive.
    Cut,
    /// Connections are accepted and nothing is answered.
    Blackhole,
}

/// How the service's bytes are read on their way back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Copied as they are.
    Raw,
    /// PostgreSQL's frontend/backend protocol, read message by message (so
    /// that one `CommandComplete` can be dropped).
    Postgres,
}

/// State shared by the proxy's tasks.
struct Shared {
    upstream: SocketAddr,
    protocol: Protocol,
    mode: watch::Sender<(Mode, u64)>,
    /// `COMMIT` acknowledgements still to drop, on connections whose
    /// `application_name` is [`Shared::ack_target`].
    acks_to_lose: AtomicU32,
    acks_lost: AtomicU32,
    ack_target: std::sync::Mutex<String>,
}

pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _tasks: JoinSet<()>,
}

impl FaultProxy {
    /// A proxy in front of `upstream`, passing bytes.
    pub async fn start(upstream: SocketAddr, protocol: Protocol) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fault proxy");
        let addr = listener.local_addr().expect("the fault proxy's address");
        let shared = Arc::new(Shared {
            upstream,
            protocol,
            mode: watch::Sender::new((Mode::Pass, 0)),
            acks_to_lose: AtomicU32::new(0),
            acks_lost: AtomicU32::new(0),
            ack_target: std::sync::Mutex::new(String::new()),
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(accept(listener, shared.clone()));
        Self {
            addr,
            shared,
            _tasks: tasks,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the mode; every connection open now ends (see the module's doc).
    pub fn set(&self, mode: Mode) {
        self.shared.mode.send_modify(|(current, epoch)| {
            *current = mode;
            *epoch += 1;
        });
    }

    /// Drops the next `count` acknowledgements of a `COMMIT` sent to
    /// connections whose `application_name` is `application` (the host names
    /// a handler's sessions `inboxd:<handler>`), each followed by a cut of
    /// that connection: the transaction committed, and its client only sees
    /// the connection go.
    pub fn lose_commit_acks(&self, application: &str, count: u32) {
        assert_eq!(self.shared.protocol, Protocol::Postgres, "COMMIT is PostgreSQL's");
        *self.shared.ack_target.lock().unwrap() = application.to_owned();
        self.shared.acks_to_lose.store(count, Ordering::SeqCst);
    }

    /// How many `COMMIT` acknowledgements were dropped so far.
    pub fn commit_acks_lost(&self) -> u32 {
        self.shared.acks_lost.load(Ordering::SeqCst)
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        connections.spawn(connection(client, shared.clone()));
        // Reap finished connections, so the set stays small.
        while connections.try_join_next().is_some() {}
    }
}

/// One client connection, for the epoch it arrived in.
async fn connection(client: TcpStream, shared: Arc<Shared>) {
    let mut mode = shared.mode.subscribe();
    let (current, _) = *mode.borrow_and_update();
    match current {
        Mode::Cut => return,
        Mode::Blackhole => {
            // Held open and unanswered until the mode changes.
            let _ = mode.changed().await;
            return;
        }
        Mode::Pass => {}
    }
    let Ok(server) = TcpStream::connect(shared.upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let (application_tx, application_rx) = watch::channel(String::new());
    let pumps = async {
        tokio::select! {
            _ = upstream_pump(client_read, server_write, &shared, application_tx) => {}
            _ = downstream_pump(server_read, client_write, &shared, application_rx) => {}
        }
    };
    // Pinned here, not moved into the select: a frozen connection keeps its
    // sockets open while nothing polls them.
    tokio::pin!(pumps);
    tokio::select! {
        _ = &mut pumps => {}
        changed = mode.changed() => {
            if changed.is_ok() && mode.borrow().0 == Mode::Blackhole {
                // Frozen: nothing more passes, and the connection closes
                // when the blackhole ends.
                let _ = mode.changed().await;
            }
        }
    }
}

/// Client to service. On PostgreSQL it reads the startup message's
/// `application_name` on the way (after an optional SSLRequest).
async fn upstream_pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: &Shared,
    application: watch::Sender<String>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut head = Vec::new();
    let mut startup_seen = shared.protocol != Protocol::Postgres;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !startup_seen {
            head.extend_from_slice(&buf[..n]);
            if let Some(name) = startup_application(&head) {
                let _ = application.send(name);
                startup_seen = true;
                head = Vec::new();
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The `application_name` of the startup message at the start of `head`
/// (past an SSLRequest, if any); `None` until it has all arrived. A startup
/// message without one gives `Some("")`.
fn startup_application(mut head: &[u8]) -> Option<String> {
    const SSL_REQUEST: u32 = 80_877_103;
    loop {
        let length = u32::from_be_bytes(head.get(..4)?.try_into().ok()?) as usize;
        let message = head.get(..length)?;
        let code = u32::from_be_bytes(message.get(4..8)?.try_into().ok()?);
        if code == SSL_REQUEST {
            head = &head[length..];
            continue;
        }
        let mut fields = message[8..].split(|b| *b == 0);
        while let (Some(key), Some(value)) = (fields.next(), fields.next()) {
            if key == b"application_name" {
                return Some(String::from_utf8_lossy(value).into_owned());
            }
            if key.is_empty() {
                break;
            }
        }
        return Some(String::new());
    }
}

/// Service to client. On PostgreSQL it forwards whole messages, and drops
/// the one acknowledging a `COMMIT` when told to (then the connection ends).
async fn downstream_pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: &Shared,
    application: watch::Receiver<String>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    // The server's answer to an SSLRequest is one byte, not a message.
    let mut first = shared.protocol == Protocol::Postgres;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if shared.protocol == Protocol::Raw {
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        if first && matches!(pending.first(), Some(b'N' | b'S')) {
            // 'N' or 'S' answering an SSLRequest (a NoticeResponse this
            // early is impossible: nothing precedes authentication).
            if to.write_all(&pending[..1]).await.is_err() {
                return;
            }
            pending.drain(..1);
        }
        first = false;
        let mut sent = 0;
        while let Some(length) = message_length(&pending[sent..]) {
            let message = &pending[sent..sent + length];
            if message[0] == b'C' && &message[5..] == b"COMMIT\0" && take_ack(shared, &application) {
                let _ = to.write_all(&pending[..sent]).await;
                return;
            }
            sent += length;
        }
        if to.write_all(&pending[..sent]).await.is_err() {
            return;
        }
        pending.drain(..sent);
    }
}

/// The whole length (type byte included) of the message at the start of
/// `bytes`, once all of it is there.
fn message_length(bytes: &[u8]) -> Option<usize> {
    let length = u32::from_be_bytes(bytes.get(1..5)?.try_into().ok()?) as usize + 1;
    (bytes.len() >= length).then_some(length)
}

/// Whether this connection's `COMMIT` acknowledgement is one to drop.
fn take_ack(shared: &Shared, application: &watch::Receiver<String>) -> bool {
    if *application.borrow() != *shared.ack_target.lock().unwrap() {
        return false;
    }
    let taken = shared
        .acks_to_lose
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1))
        .is_ok();
    if taken {
        shared.acks_lost.fetch_add(1, Ordering::SeqCst);
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_startup_message_names_its_application() {
        let mut message = Vec::new();
        let body = b"user\0u\0application_name\0inboxd:billing\0\0";
        message.extend_from_slice(&((8 + body.len()) as u32).to_be_bytes());
        message.extend_from_slice(&196_608u32.to_be_bytes());
        message.extend_from_slice(body);
        let mut with_ssl = [8u32.to_be_bytes(), 80_877_103u32.to_be_bytes()].concat();
        with_ssl.extend_from_slice(&message);
        assert_eq!(startup_application(&message).as_deref(), Some("inboxd:billing"));
        assert_eq!(startup_application(&with_ssl).as_deref(), Some("inboxd:billing"));
        assert_eq!(startup_application(&with_ssl[..12]), None);
    }
}
