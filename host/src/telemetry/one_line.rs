//! One log event, one line: line breaks inside a text-format event are
//! written escaped.
//!
//! Guests choose much of what the host logs: their log lines, their stdout
//! and stderr, their reasons, the SQL and the errors it meets. With line
//! breaks kept, a guest's `ok\n2026-12-07T10:00:00Z  INFO guest: handler="payments" ...`
//! printed a line that looked like another handler's, or the host's (the
//! forty-eighth read). tracing-subscriber escapes terminal controls but not
//! `\n` or `\r`. Escaping every field at each call site would miss the next
//! one; the writer sees each event whole (the fmt layer formats an event
//! into one buffer and writes it with one `write_all`), so it escapes there,
//! for every event, whoever made its text. JSON lines are escaped already
//! and pass unchanged.

use std::borrow::Cow;
use std::io::{self, Write};
use tracing_subscriber::fmt::MakeWriter;

/// A [`MakeWriter`] whose writers escape the line breaks inside each event.
pub struct OneLine<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for OneLine<M> {
    type Writer = OneLineWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLineWriter(self.0.make_writer())
    }
}

pub struct OneLineWriter<W>(W);

impl<W: Write> Write for OneLineWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(&escaped(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// `event` with every line break but a last `\n` written as an escape:
/// `\n`, `\r`, and Unicode's line and paragraph separators (which some
/// log viewers break lines at).
pub fn escaped(event: &[u8]) -> Cow<'_, [u8]> {
    let (body, end) = match event.strip_suffix(b"\n") {
        Some(body) => (body, &b"\n"[..]),
        None => (event, &b""[..]),
    };
    let breaks = |b: &[u8]| b.contains(&b'\n') || b.contains(&b'\r') || separator_at(b).is_some();
    if !breaks(body) {
        return Cow::Borrowed(event);
    }
    let mut out = Vec::with_capacity(event.len() + 16);
    let mut rest = body;
    while let Some(&b) = rest.first() {
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0xE2 if rest.starts_with(LINE_SEPARATOR) => {
                out.extend_from_slice(b"\\u{2028}");
                rest = &rest[LINE_SEPARATOR.len()..];
                continue;
            }
            0xE2 if rest.starts_with(PARAGRAPH_SEPARATOR) => {
                out.extend_from_slice(b"\\u{2029}");
                rest = &rest[PARAGRAPH_SEPARATOR.len()..];
                continue;
            }
            _ => out.push(b),
        }
        rest = &rest[1..];
    }
    out.extend_from_slice(end);
    Cow::Owned(out)
}

const LINE_SEPARATOR: &[u8] = "\u{2028}".as_bytes();
const PARAGRAPH_SEPARATOR: &[u8] = "\u{2029}".as_bytes();

fn separator_at(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(3)
        .position(|w| w == LINE_SEPARATOR || w == PARAGRAPH_SEPARATOR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn line_breaks_inside_an_event_are_escaped() {
        assert_eq!(&*escaped(b"plain line\n"), b"plain line\n");
        assert!(matches!(escaped(b"plain line\n"), Cow::Borrowed(_)));
        assert_eq!(&*escaped(b"a\nb\r\nc\n"), b"a\\nb\\r\\nc\n");
        assert_eq!(
            &*escaped("a\u{2028}b\u{2029}c\n".as_bytes()),
            b"a\\u{2028}b\\u{2029}c\n"
        );
        assert_eq!(
            &*escaped("caf\u{e9} \u{2020}\n".as_bytes()),
            "caf\u{e9} \u{2020}\n".as_bytes()
        );
        assert_eq!(&*escaped(b"no end\nhere"), b"no end\\nhere");
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Regression (issue 23, the forty-eighth read): a guest's log line with
    /// a line break printed what looked like a second line of the host's
    /// own, naming another handler. Through the host's text format, one
    /// guest line is one line of the log.
    #[test]
    fn a_guest_cannot_forge_a_log_line() {
        let captured = Captured::default();
        let sink = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(OneLine(move || sink.clone()))
            .with_ansi(false)
            .finish();
        let forged =
            "ok\n2026-12-07T10:00:00.000000Z  INFO guest: handler=\"payments\" version=7: refund issued";
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "guest", handler = "hostile", "{forged}");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("handler=\"hostile\"") && text.contains("ok\\n2026"),
            "{text}"
        );
    }
}
