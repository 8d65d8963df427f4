//! Guest stdout and stderr: captured per invocation, bounded, then logged.
//!
//! A guest may print as much as it likes; the host keeps the first
//! `limits.output_bytes` and counts the rest, so a chatty or hostile guest can
//! neither fill the host's log nor its memory. Writes never fail, so a guest is
//! not broken by the bound.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

#[derive(Clone)]
pub struct GuestOutput {
    inner: Arc<Mutex<Captured>>,
}

#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: u64,
    capacity: usize,
}

impl GuestOutput {
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Captured {
                capacity,
                ..Captured::default()
            })),
        }
    }

    /// The captured text (lossy UTF-8) and how many bytes were dropped past the bound.
    pub fn take(&self) -> (String, u64) {
        let mut captured = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let text = String::from_utf8_lossy(&captured.bytes).into_owned();
        let dropped = captured.dropped;
        captured.bytes.clear();
        captured.dropped = 0;
        (text, dropped)
    }

    fn write(&self, buf: &[u8]) {
        let mut captured = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let room = captured.capacity.saturating_sub(captured.bytes.len());
        let kept = room.min(buf.len());
        captured.bytes.extend_from_slice(&buf[..kept]);
        captured.dropped += (buf.len() - kept) as u64;
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl tokio::io::AsyncWrite for GuestOutput {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_bytes_and_counts_the_rest() {
        let out = GuestOutput::new(5);
        out.write(b"hello world");
        out.write(b"!");
        assert_eq!(out.take(), ("hello".to_owned(), 7));
        assert_eq!(out.take(), (String::new(), 0));
    }
}
