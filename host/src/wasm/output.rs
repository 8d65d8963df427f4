//! Guest stdout and stderr: captured per invocation, bounded, then logged.
//!
//! A guest may print as much as it likes; the host keeps the first
//! `limits.output_bytes` and counts the rest, so a chatty or hostile guest can
//! neither fill the host's log nor its memory. Writes never fail, so a guest is
//! not broken by the bound.
//!
//! Each `get-stdout` makes a new stream. wasmtime-wasi's default stream runs
//! a tokio task per stream with an 8 KiB queue of its own: 99,000 of them
//! held 70 MB of the host in one event (the review of issue 23's compile
//! worker), none of it the guest's memory. Ours writes synchronously into
//! the one bounded capture, so a stream is a small table entry and no task.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

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

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

/// Always ready, never full: what is past the bound is counted and dropped.
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        GuestOutput::write(self, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        // What wasmtime-wasi's own streams allow per write.
        Ok(64 << 10)
    }
}

#[async_trait::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
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

    /// A guest's stream writes straight into the one capture: no task, no
    /// queue of its own, whatever it writes.
    #[test]
    fn every_stream_writes_synchronously_into_the_one_bounded_capture() {
        let out = GuestOutput::new(5);
        let mut streams: Vec<Box<dyn OutputStream>> = (0..3).map(|_| out.p2_stream()).collect();
        for stream in &mut streams {
            assert!(stream.check_write().unwrap() > 0);
            stream.write(bytes::Bytes::from_static(b"abc")).unwrap();
        }
        assert_eq!(out.take(), ("abcab".to_owned(), 4));
    }
}
