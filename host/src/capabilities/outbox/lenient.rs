//! Whether a lenient JSON reader takes a payload for an object: what the
//! host must either stamp (strict JSON) or refuse, since a consumer reading
//! such a payload's `event_id` would dedup on a value the publisher chose.
//!
//! Lenient readers detect the encoding from a byte-order mark or the first
//! four bytes (RFC 4627's rule: Python's `json.loads`, Jackson), and skip
//! blanks, comments (`//` and `#` to the end of a line, which `\r`, U+2028
//! and U+2029 end too; `/* */`) and Gson's `)]}'` prefix before the object
//! (Gson's lenient mode, Jackson's `ALLOW_COMMENTS`, JSON5). The sixth and
//! seventh reads of this round (issue 23) each found such a payload going
//! out with the guest's `event_id`.

/// The payload's encoding when it is not plain UTF-8 (a name for the
/// refusal), and its text as a lenient reader decodes it. A binary format
/// decodes to text that starts with no object (Confluent's Avro framing
/// reads as UTF-32 whose first character is NUL).
pub fn decode(payload: &[u8]) -> (Option<&'static str>, Box<dyn Iterator<Item = char> + '_>) {
    let (name, bom, unit, big_endian): (_, usize, usize, bool) = match payload {
        [0xff, 0xfe, 0, 0, ..] => ("UTF-32 with a byte-order mark", 4, 4, false),
        [0, 0, 0xfe, 0xff, ..] => ("UTF-32 with a byte-order mark", 4, 4, true),
        [0xef, 0xbb, 0xbf, ..] => ("UTF-8 with a byte-order mark", 3, 1, false),
        [0xff, 0xfe, ..] => ("UTF-16 with a byte-order mark", 2, 2, false),
        [0xfe, 0xff, ..] => ("UTF-16 with a byte-order mark", 2, 2, true),
        [0, 0, _, _, ..] => ("UTF-32", 0, 4, true),
        [0, _, ..] => ("UTF-16", 0, 2, true),
        [_, 0, 0, 0, ..] => ("UTF-32", 0, 4, false),
        [_, 0, ..] => ("UTF-16", 0, 2, false),
        _ => return (None, Box::new(utf8(payload))),
    };
    let body = &payload[bom..];
    let units = move |size: usize| {
        body.chunks_exact(size).map(move |c| {
            let bytes = c.iter().map(|&b| u32::from(b));
            if big_endian {
                bytes.fold(0, |acc, b| acc << 8 | b)
            } else {
                bytes.rev().fold(0, |acc, b| acc << 8 | b)
            }
        })
    };
    let chars: Box<dyn Iterator<Item = char>> = match unit {
        1 => Box::new(utf8(body)),
        2 => Box::new(
            char::decode_utf16(units(2).map(|u| u as u16)).map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER)),
        ),
        _ => Box::new(units(4).map(|u| char::from_u32(u).unwrap_or(char::REPLACEMENT_CHARACTER))),
    };
    (Some(name), chars)
}

/// The characters of `bytes`, invalid sequences dropped, as a reader that
/// decodes with "ignore" has them (`\xff{"event_id": ...}` is an object to
/// Python's `decode("utf-8", "ignore")`: the tenth read of this round).
fn utf8(bytes: &[u8]) -> impl Iterator<Item = char> + '_ {
    bytes.utf8_chunks().flat_map(|chunk| chunk.valid().chars())
}

/// Whether `text` starts with an object after what lenient readers skip.
pub fn object_start(text: impl Iterator<Item = char>) -> bool {
    let mut text = text.peekable();
    let line_end = |c: char| matches!(c, '\n' | '\r' | '\u{2028}' | '\u{2029}');
    loop {
        match text.next() {
            Some('{') => return true,
            Some(c) if c.is_whitespace() || c == '\u{feff}' => {}
            Some('#') => {
                text.find(|&c| line_end(c));
            }
            Some('/') => match text.next() {
                Some('/') => {
                    text.find(|&c| line_end(c));
                }
                Some('*') => {
                    let mut star = false;
                    loop {
                        match text.next() {
                            Some('/') if star => break,
                            Some(c) => star = c == '*',
                            None => return false,
                        }
                    }
                }
                _ => return false,
            },
            Some(')') => {
                if !(text.next() == Some(']') && text.next() == Some('}') && text.next() == Some('\'')) {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(payload: &[u8]) -> bool {
        object_start(decode(payload).1)
    }

    #[test]
    fn what_lenient_readers_skip_before_an_object() {
        for text in [
            "{}",
            " \t\n{",
            "/**/{",
            "/* a * b **/{",
            "// c\n{",
            "// c\r{",
            "# c\u{2028}{",
            ")]}'\n{",
            "\u{feff}\u{a0}{",
        ] {
            assert!(object(text.as_bytes()), "{text:?}");
        }
        for text in [
            "",
            "[{}]",
            "x{",
            "/ {",
            "/* never closed {",
            "// no end {",
            ")]}",
            "#tag",
        ] {
            assert!(!object(text.as_bytes()), "{text:?}");
        }
    }

    #[test]
    fn encodings_are_detected_and_binary_is_not_text() {
        let utf16le: Vec<u8> = "/**/{".encode_utf16().flat_map(u16::to_le_bytes).collect();
        let (name, text) = decode(&utf16le);
        assert_eq!(name, Some("UTF-16"));
        assert!(object_start(text));
        let bom = [&[0xef, 0xbb, 0xbf][..], b"// x\r{}"].concat();
        let (name, text) = decode(&bom);
        assert_eq!(name, Some("UTF-8 with a byte-order mark"));
        assert!(object_start(text));
        for binary in [vec![0, 0, 0, 0, b'{', 1], vec![0xfe], vec![0x80, b'x', b'{']] {
            assert!(!object(&binary), "{binary:?}");
        }
        // Invalid bytes a lossy decoder drops before an object.
        assert!(object(&[0xff, b' ', b'{']));
    }
}
