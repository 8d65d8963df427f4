//! One field of a JSON payload, read without building the document.
//!
//! The event id and the business key are one value each at a known path.
//! Reading them through `serde_json::Value` built the whole payload as a tree
//! first: a `[0,0,0,...]` of a few megabytes is 16 times its size as a tree,
//! and a compressed record of a gigabyte's zeros was a crash of the host
//! (issue 23, seventeenth read of its third round). Here the document is
//! walked once and nothing but the wanted value is kept.
//!
//! The answer is the one `serde_json::Value` gives, so no producer can make
//! the host read an id that a handler parsing the same payload would not:
//! every value off the path is read as `Value` reads it, only not kept
//! (serde's `IgnoredAny` checks less: it let strings that are not UTF-8,
//! lone surrogates and numbers out of range through, the eighteenth read);
//! the last of duplicate names wins (at every level of the path, as a later
//! object replaces an earlier one whole); nesting past serde_json's 128
//! levels, a document that is not JSON, or anything after its value, is an
//! error.

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// The value at the path.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    String(String),
    /// A number as `serde_json` writes it (`1e3` is `1000.0`).
    Number(String),
    Bool(bool),
    Null,
    /// An object or an array, named (never copied: it may be the whole payload).
    Container(&'static str),
}

/// How far the walk got.
#[derive(Debug)]
pub enum Read {
    /// The whole document is JSON; the value at the path, if there is one.
    Whole(Option<Found>),
    /// The document ended early (`cut`: it is the first part of a longer
    /// one); the value at the path as far as it was read.
    Cut(Option<Found>),
}

/// The value at `path` in `payload`. `cut`: the payload is the first part of
/// a longer one, so where its reading stops is not an error (the value found
/// so far is the answer, which a later duplicate name could have replaced;
/// a cut can leave a number or an escape unfinished as well as a document).
pub fn read(payload: &[u8], path: &[&str], cut: bool) -> Result<Read, serde_json::Error> {
    let mut found = None;
    let mut de = serde_json::Deserializer::from_slice(payload);
    let walked = Seek {
        path,
        found: &mut found,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match walked {
        Ok(()) => Ok(Read::Whole(found)),
        Err(_) if cut => Ok(Read::Cut(found)),
        Err(error) => Err(error),
    }
}

/// Walks one value; at the end of the path, keeps it.
struct Seek<'a, 'p> {
    path: &'p [&'p str],
    found: &'a mut Option<Found>,
}

impl<'de> DeserializeSeed<'de> for Seek<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seek<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.keep(Found::Bool(v));
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.keep(Found::Number(serde_json::Number::from(v).to_string()));
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.keep(Found::Number(serde_json::Number::from(v).to_string()));
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        // serde_json reads no NaN or infinity, so `from_f64` always has one.
        let text = serde_json::Number::from_f64(v).map_or_else(|| v.to_string(), |n| n.to_string());
        self.keep(Found::Number(text));
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        if self.path.is_empty() {
            *self.found = Some(Found::String(v.to_owned()));
        }
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.keep(Found::Null);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.keep(Found::Container("an array"));
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((field, rest)) = self.path.split_first() else {
            *self.found = Some(Found::Container("an object"));
            while map.next_key_seed(IsName(""))?.is_some() {
                map.next_value_seed(Skip)?;
            }
            return Ok(());
        };
        while let Some(matches) = map.next_key_seed(IsName(field))? {
            if matches {
                // A later member of the name replaces an earlier one whole.
                *self.found = None;
                map.next_value_seed(Seek {
                    path: rest,
                    found: &mut *self.found,
                })?;
            } else {
                map.next_value_seed(Skip)?;
            }
        }
        Ok(())
    }
}

impl Seek<'_, '_> {
    /// Keeps a scalar or names a container, if the path ends here.
    fn keep(self, value: Found) {
        if self.path.is_empty() {
            *self.found = Some(value);
        }
    }
}

/// A value off the path: read as `serde_json::Value` reads it (strings
/// checked, numbers in range, nesting within serde_json's limit), not kept.
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(IsName(""))?.is_some() {
            map.next_value_seed(Skip)?;
        }
        Ok(())
    }
}

/// Whether a member's name is the one wanted, without keeping the name (a
/// name can be as long as the payload).
struct IsName<'p>(&'p str);

impl<'de> DeserializeSeed<'de> for IsName<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for IsName<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `serde_json::Value` says is at the path: the answer to match.
    fn by_value(payload: &str, path: &[&str]) -> Option<Option<Found>> {
        let json: serde_json::Value = serde_json::from_str(payload).ok()?;
        let at = path.iter().try_fold(&json, |value, field| value.get(field));
        Some(at.map(|value| match value {
            serde_json::Value::String(s) => Found::String(s.clone()),
            serde_json::Value::Number(n) => Found::Number(n.to_string()),
            serde_json::Value::Bool(b) => Found::Bool(*b),
            serde_json::Value::Null => Found::Null,
            serde_json::Value::Array(_) => Found::Container("an array"),
            serde_json::Value::Object(_) => Found::Container("an object"),
        }))
    }

    fn walked(payload: &str, path: &[&str]) -> Option<Option<Found>> {
        match read(payload.as_bytes(), path, false) {
            Ok(Read::Whole(found)) => Some(found),
            Ok(Read::Cut(_)) => panic!("not cut"),
            Err(_) => None,
        }
    }

    /// The walk answers what the tree answers, duplicates and all: a
    /// difference would let a producer give the host one id and a handler
    /// that parses the payload another.
    #[test]
    fn the_walk_reads_what_serde_json_value_reads() {
        let payloads = [
            r#"{"event_id":"a"}"#,
            r#"{"event_id":"a","event_id":"b"}"#,
            r#"{"event_id":"a","event_id":5}"#,
            r#"{"event_id":"\u0061\n\"x"}"#,
            r#"{"x":[1,{"event_id":"no"}],"event_id":null}"#,
            r#"{"event_id":[1,2]}"#,
            r#"{"event_id":{"a":1}}"#,
            r#"{"event_id":1e3}"#,
            r#"{"event_id":-7}"#,
            r#"{"event_id":18446744073709551615}"#,
            r#"{"event_id":0.1}"#,
            r#"{"event_id":true}"#,
            r#"{"order":{"id":"o-1"},"order":{"other":1}}"#,
            r#"{"order":{"id":"o-1","id":"o-2"}}"#,
            r#"{"order":{"id":"o-1"},"order":7}"#,
            r#"{"order":{"id":{"deep":[[[]]]}}}"#,
            r#"[{"event_id":"a"}]"#,
            r#""event_id""#,
            r#"{"event_id":"a"} trailing"#,
            r#"{"event_id":"a""#,
            r#"{"event_id":"a",}"#,
            "",
            "not json",
        ];
        for payload in payloads {
            for path in [&["event_id"][..], &["order", "id"][..], &["order"][..]] {
                assert_eq!(
                    walked(payload, path),
                    by_value(payload, path),
                    "{payload} at {path:?}"
                );
            }
        }
    }

    #[test]
    fn a_cut_payload_answers_with_what_was_read_before_the_cut() {
        let payload = br#"{"event_id":"a","big":[0,0,0,0"#;
        assert!(read(payload, &["event_id"], false).is_err());
        match read(payload, &["event_id"], true).unwrap() {
            Read::Cut(found) => assert_eq!(found, Some(Found::String("a".into()))),
            other => panic!("{other:?}"),
        }
        // Nothing read before the cut: no value, whatever stopped the reading.
        assert!(matches!(
            read(b"{event_id", &["event_id"], true),
            Ok(Read::Cut(None))
        ));
    }

    /// Deep nesting is refused as `Value` refuses it (serde_json's depth
    /// limit), on the path or off it: an error, not a stack overflow.
    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = |at: &str| {
            format!(
                r#"{{"{at}":{}{},"event_id":"a"}}"#,
                "[".repeat(100_000),
                "]".repeat(100_000)
            )
        };
        assert!(read(deep("x").as_bytes(), &["event_id"], false).is_err());
        assert!(read(deep("event_id").as_bytes(), &["event_id"], false).is_err());
    }

    /// What `IgnoredAny` let through and `Value` refuses (the eighteenth
    /// read): off the path too, the payload is not JSON.
    #[test]
    fn what_value_refuses_off_the_path_is_refused() {
        let bad: [&[u8]; 4] = [
            b"{\"event_id\":\"a\",\"x\":\"\xff\"}",
            br#"{"event_id":"a","x":"\ud800"}"#,
            br#"{"event_id":"a","n":1e400}"#,
            br#"{"event_id":"a","o":{"\ud800":1}}"#,
        ];
        for payload in bad {
            assert!(serde_json::from_slice::<serde_json::Value>(payload).is_err());
            assert!(
                read(payload, &["event_id"], false).is_err(),
                "{}",
                String::from_utf8_lossy(payload)
            );
        }
    }

    /// A cut can end inside a number or an escape: the id before it stands.
    #[test]
    fn a_cut_inside_a_number_or_an_escape_keeps_the_id_before_it() {
        for payload in [
            &br#"{"event_id":"a","n":-"#[..],
            br#"{"event_id":"a","n":1."#,
            br#"{"event_id":"a","n":1e"#,
            br#"{"event_id":"a","s":"\u00"#,
        ] {
            match read(payload, &["event_id"], true).unwrap() {
                Read::Cut(found) => assert_eq!(found, Some(Found::String("a".into()))),
                other => panic!("{other:?}"),
            }
        }
    }
}
