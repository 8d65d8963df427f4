//! Record headers as the host stores them in a text column (dead letters
//! and outbox messages): `[{"name": .., "value": ..}]`, or `"hex"` instead
//! of `"value"` when a value is not UTF-8, so nothing is lost.
//!
//! Both directions go through typed serde, never `serde_json::Value`: a
//! record's header count has no bound but the broker's message size, and a
//! megabyte of empty headers read through `Value` maps held ten times what
//! the headers themselves hold (issue 23, fifth read).

use super::DecodeError;
use super::columns::Columns;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// One header as written.
#[derive(Serialize)]
struct Written<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hex: Option<String>,
}

/// One header as read back: owned, so a value moves into the result.
#[derive(Deserialize)]
struct Read<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default, borrow)]
    value: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    hex: Option<Cow<'a, str>>,
}

/// `headers` as the column's JSON.
pub fn headers_json(headers: &[(String, Vec<u8>)]) -> String {
    let list: Vec<Written> = headers
        .iter()
        .map(|(name, value)| match std::str::from_utf8(value) {
            Ok(text) => Written {
                name,
                value: Some(text),
                hex: None,
            },
            Err(_) => Written {
                name,
                value: None,
                hex: Some(hex::encode(value)),
            },
        })
        .collect();
    // Serializing strings and options into a String cannot fail.
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

/// Reads headers back from [`headers_json`]; `None` if `json` is not what
/// it writes (a header is never dropped for being unreadable).
pub fn parse_headers(json: &str) -> Option<Vec<(String, Vec<u8>)>> {
    let list: Vec<Read> = serde_json::from_str(json).ok()?;
    list.into_iter()
        .map(|h| {
            let value = match (h.value, h.hex) {
                (Some(text), _) => text.into_owned().into_bytes(),
                (None, Some(hex)) => hex::decode(hex.as_bytes()).ok()?,
                (None, None) => return None,
            };
            Some((h.name.into_owned(), value))
        })
        .collect()
}

/// A host row's headers column ([`headers_json`]); NULL (a summary's) is none.
pub fn headers_column(c: &mut Columns, column: &'static str) -> Result<Vec<(String, Vec<u8>)>, DecodeError> {
    match c.opt_text(column)? {
        None => Ok(Vec::new()),
        Some(json) => parse_headers(&json)
            .ok_or_else(|| c.wrong(column, "headers as the host writes them", "other text")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_text_binary_and_escapes() {
        let headers = vec![
            ("trace".to_string(), b"abc".to_vec()),
            ("bin".to_string(), vec![0xff, 0x00, 0x80]),
            (String::new(), Vec::new()),
            ("quote\"\\\n".to_string(), "é\u{1F600}\"".as_bytes().to_vec()),
        ];
        let json = headers_json(&headers);
        assert_eq!(
            &json[..61],
            r#"[{"name":"trace","value":"abc"},{"name":"bin","hex":"ff0080"}"#
        );
        assert_eq!(parse_headers(&json), Some(headers));
        assert_eq!(parse_headers("[]"), Some(Vec::new()));
    }

    #[test]
    fn text_that_is_not_stored_headers_is_refused_not_dropped() {
        for bad in [
            "",
            "{}",
            r#"[{"name":"a"}]"#,
            r#"[{"value":"a"}]"#,
            r#"[{"name":"a","hex":"zz"}]"#,
            r#"[{"name":1,"value":"a"}]"#,
        ] {
            assert_eq!(parse_headers(bad), None, "{bad}");
        }
    }
}
