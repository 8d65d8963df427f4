//! An event's business key (`[handlers.dedup]`): the value the producer
//! names the thing by (an order id), read from a JSON path of the payload or
//! from a header. Two events with one business key inside the handler's
//! window are one effect, whatever their event ids.

use crate::config::DedupConfig;
use sha2::{Digest, Sha256};

/// Keys longer than this are stored as their digest (`sha256:<hex>`): the
/// key is compared, never shown, and a row per key must stay small.
pub const MAX_KEY_BYTES: usize = 256;

/// The business key `config` names in the record, if it has one. A missing
/// field or header, JSON `null`, an object or an array (and a payload that is
/// not JSON, for a JSON path) is no key: the event is deduplicated by its
/// event id alone. A string is the key as it is; a number or boolean, its
/// JSON text.
pub fn extract(config: &DedupConfig, headers: &[(String, Vec<u8>)], payload: &[u8]) -> Option<String> {
    let key = match (&config.header, config.json_path()) {
        (Some(name), _) => {
            // The last header with the name wins, as for the event id.
            let (_, value) = headers.iter().rev().find(|(n, _)| n == name)?;
            String::from_utf8_lossy(value).into_owned()
        }
        (None, Some(path)) => {
            let json: serde_json::Value = serde_json::from_slice(payload).ok()?;
            let value = path.iter().try_fold(&json, |value, field| value.get(field))?;
            match value {
                serde_json::Value::String(text) => text.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                _ => return None,
            }
        }
        (None, None) => return None,
    };
    if key.len() > MAX_KEY_BYTES {
        return Some(format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes()))));
    }
    Some(key)
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

    #[test]
    fn a_key_comes_from_a_json_path_or_a_header() {
        let payload = br#"{"order_id":"o-1","n":42,"ok":true,"order":{"id":"inner"},"none":null,"list":[1]}"#;
        let key = |path: &str| extract(&by_path(path), &[], payload);
        assert_eq!(key("$.order_id").as_deref(), Some("o-1"));
        assert_eq!(key("$.n").as_deref(), Some("42"));
        assert_eq!(key("$.ok").as_deref(), Some("true"));
        assert_eq!(key("$.order.id").as_deref(), Some("inner"));
        assert_eq!(key("$.none"), None);
        assert_eq!(key("$.list"), None);
        assert_eq!(key("$.order"), None, "an object is no key");
        assert_eq!(key("$.missing"), None);
        assert_eq!(extract(&by_path("$.order_id"), &[], b"not json"), None);

        let header = DedupConfig {
            key: None,
            header: Some("order-id".into()),
            window: Duration::from_secs(60),
        };
        let headers = vec![
            ("order-id".to_owned(), b"first".to_vec()),
            ("order-id".to_owned(), b"last".to_vec()),
        ];
        assert_eq!(extract(&header, &headers, payload).as_deref(), Some("last"));
        assert_eq!(extract(&header, &[], payload), None);
    }

    #[test]
    fn a_long_key_is_its_digest() {
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        let payload = serde_json::json!({ "k": long }).to_string();
        let key = extract(&by_path("$.k"), &[], payload.as_bytes()).unwrap();
        assert!(key.starts_with("sha256:") && key.len() == 7 + 64, "{key}");
        let exact = "y".repeat(MAX_KEY_BYTES);
        let payload = serde_json::json!({ "k": exact }).to_string();
        assert_eq!(extract(&by_path("$.k"), &[], payload.as_bytes()), Some(exact));
    }
}
