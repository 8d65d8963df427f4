//! An event's business key (`[handlers.dedup]`): the value the producer
//! names the thing by (an order id), read from a JSON path of the payload or
//! from a header. Two events with one business key inside the handler's
//! window are one effect, whatever their event ids.

use crate::config::DedupConfig;
use crate::json_field::{self, Found, Read};
use sha2::{Digest, Sha256};

/// Keys longer than this are compared by their digest: the key is
/// compared, never shown, and a row per key must stay small.
pub const MAX_KEY_BYTES: usize = 256;

/// The business key `config` names in the record, if it has one, as stored:
/// `k:` and the key, or `h:` and the hex SHA-256 of its bytes for a key
/// over [`MAX_KEY_BYTES`], one that is not UTF-8 (a binary header) or one
/// holding a NUL (PostgreSQL text cannot). The two prefixes keep a key that
/// looks like a digest apart from a digest. A missing field or header, JSON
/// `null`, `""`, an object or an array (and, for a JSON path, a payload that
/// is not JSON) is no key: the event is deduplicated by its event id alone.
/// A string is the key as it is; a number or boolean, its JSON text.
///
/// A record the host kept only in part (see [`crate::record::Cut`]) is
/// never run, and has no key.
pub fn of(config: &DedupConfig, record: &crate::record::Record) -> Option<String> {
    if record.cut.is_some() {
        return None;
    }
    extract(config, &record.headers, &record.payload)
}

/// As [`of`], from a record's parts.
pub fn extract(config: &DedupConfig, headers: &[(String, Vec<u8>)], payload: &[u8]) -> Option<String> {
    let raw: Vec<u8> = match (&config.header, config.json_path()) {
        (Some(name), _) => {
            // The last header with the name wins, as for the event id.
            let (_, value) = headers.iter().rev().find(|(n, _)| n == name)?;
            value.clone()
        }
        (None, Some(path)) => {
            // Walked, not built as a tree (see `json_field`).
            match json_field::read(payload, &path, false).ok()? {
                Read::Whole(Some(Found::String(text) | Found::Number(text))) => text.into_bytes(),
                Read::Whole(Some(Found::Bool(b))) => b.to_string().into_bytes(),
                _ => return None,
            }
        }
        (None, None) => return None,
    };
    if raw.is_empty() {
        return None;
    }
    match String::from_utf8(raw) {
        Ok(text) if text.len() <= MAX_KEY_BYTES && !text.contains('\0') => Some(format!("k:{text}")),
        Ok(text) => Some(digest(text.as_bytes())),
        Err(not_text) => Some(digest(not_text.as_bytes())),
    }
}

fn digest(bytes: &[u8]) -> String {
    format!("h:{}", hex::encode(Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn by_path(path: &str) -> DedupConfig {
        DedupConfig {
            key: Some(path.into()),
            header: None,
            window: Duration::from_secs(60),
        }
    }

    fn by_header() -> DedupConfig {
        DedupConfig {
            key: None,
            header: Some("order-id".into()),
            window: Duration::from_secs(60),
        }
    }

    #[test]
    fn a_key_comes_from_a_json_path_or_a_header() {
        let payload =
            br#"{"order_id":"o-1","n":42,"ok":true,"order":{"id":"inner"},"none":null,"list":[1],"empty":""}"#;
        let key = |path: &str| extract(&by_path(path), &[], payload);
        assert_eq!(key("$.order_id").as_deref(), Some("k:o-1"));
        assert_eq!(key("$.n").as_deref(), Some("k:42"));
        assert_eq!(key("$.ok").as_deref(), Some("k:true"));
        assert_eq!(key("$.order.id").as_deref(), Some("k:inner"));
        assert_eq!(key("$.none"), None);
        assert_eq!(key("$.list"), None);
        assert_eq!(key("$.empty"), None, "an empty string is no key");
        assert_eq!(key("$.order"), None, "an object is no key");
        assert_eq!(key("$.missing"), None);
        assert_eq!(extract(&by_path("$.order_id"), &[], b"not json"), None);

        let headers = vec![
            ("order-id".to_owned(), b"first".to_vec()),
            ("order-id".to_owned(), b"last".to_vec()),
        ];
        assert_eq!(
            extract(&by_header(), &headers, payload).as_deref(),
            Some("k:last")
        );
        assert_eq!(extract(&by_header(), &[], payload), None);
    }

    #[test]
    fn long_binary_and_nul_keys_are_their_digests_and_never_collide_with_a_literal() {
        let key = |value: Vec<u8>| extract(&by_header(), &[("order-id".to_owned(), value)], b"");
        let long = key(vec![b'x'; MAX_KEY_BYTES + 1]).unwrap();
        assert!(long.starts_with("h:") && long.len() == 2 + 64, "{long}");
        assert_eq!(key(vec![b'y'; MAX_KEY_BYTES]).unwrap().len(), 2 + MAX_KEY_BYTES);
        // Two binary ids that differ only in bytes that are not UTF-8 stay two keys.
        let (a, b) = (key(vec![0xff, 0x01]).unwrap(), key(vec![0xfe, 0x01]).unwrap());
        assert!(a.starts_with("h:") && a != b, "{a} {b}");
        assert!(key(b"a\0b".to_vec()).unwrap().starts_with("h:"));
        // A literal that looks like a digest is still a literal.
        let literal = key(long.as_bytes()[2..].to_vec()).unwrap();
        assert_ne!(literal, long);
        assert_eq!(key(Vec::new()), None);
    }
}
