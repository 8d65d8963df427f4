//! One log event, one line: line breaks and other control characters
//! inside a text-format event are written escaped.
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

/// `event` with every control character but a tab and a last `\n` written
/// as an escape: `\n`, `\r`, `\x1b` and the like for the other C0 controls
/// and DEL, `\u{85}` for the C1 controls (NEL among them), and Unicode's line
/// and paragraph separators. Log viewers break lines at any of them, and
/// terminals act on escape sequences; the host's own format writes none
/// (its log has no colours, see `telemetry::init`), so any in an event came
/// from what it logged.
pub fn escaped(event: &[u8]) -> Cow<'_, [u8]> {
    let (body, end) = match event.strip_suffix(b"\n") {
        Some(body) => (body, &b"\n"[..]),
        None => (event, &b""[..]),
    };
    if !body
        .iter()
        .enumerate()
        .any(|(i, &b)| is_control(b) || special_at(&body[i..]).is_some())
    {
        return Cow::Borrowed(event);
    }
    let mut out = Vec::with_capacity(event.len() + 16);
    let mut rest = body;
    while let Some(&b) = rest.first() {
        if let Some((len, code)) = special_at(rest) {
            out.extend_from_slice(format!("\\u{{{code:x}}}").as_bytes());
            rest = &rest[len..];
            continue;
        }
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            _ if is_control(b) => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            _ => out.push(b),
        }
        rest = &rest[1..];
    }
    out.extend_from_slice(end);
    Cow::Owned(out)
}

/// A C0 control other than a tab, or DEL.
fn is_control(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
}

/// The UTF-8 length and code point of a C1 control (U+0080 to U+009F) or a
/// line or paragraph separator (U+2028, U+2029) at the start of `bytes`.
fn special_at(bytes: &[u8]) -> Option<(usize, u32)> {
    match bytes {
        [0xC2, second @ 0x80..=0x9F, ..] => Some((2, u32::from(*second))),
        [0xE2, 0x80, 0xA8, ..] => Some((3, 0x2028)),
        [0xE2, 0x80, 0xA9, ..] => Some((3, 0x2029)),
        _ => None,
    }
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
        // Other controls too (the forty-ninth read): vertical tab, escape
        // sequences, NUL, DEL and the C1 controls, NEL among them; not a tab.
        assert_eq!(
            &*escaped(b"a\x0bb\x1b[2Kc\x00\x7f\td\n"),
            b"a\\x0bb\\x1b[2Kc\\x00\\x7f\td\n"
        );
        assert_eq!(
            &*escaped("nel\u{85}csi\u{9b}\n".as_bytes()),
            b"nel\\u{85}csi\\u{9b}\n"
        );
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
