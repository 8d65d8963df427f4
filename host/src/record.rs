//! A Kafka record as the pipeline sees it: owned, so it outlives the consumer's
//! buffer while its transaction (and any retries) run.

#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp_ms: Option<i64>,
    /// Set when the host kept only the first part of the record: see [`Cut`].
    pub cut: Option<Cut>,
}

/// A record too large to keep whole: its key, its payload, or its headers
/// together were longer than [`Cut::kept`] as consumed (the larger of its
/// handler's `limits.max_payload_bytes` and [`KEPT_AT_LEAST`]). The host
/// keeps the payload's first `kept` bytes and the headers that fit in `kept`,
/// no key past it, and never reads past them (issue 23, seventeenth read of
/// its third round: a compressed record of a gigabyte's zeros was copied
/// whole, then parsed as a JSON tree many times its size, and the host was
/// killed for memory at every restart). Such a record is never run: it is
/// parked as a `limit` letter whose `record_bytes` says how large it was, and
/// the letter cannot be replayed. A record past its handler's limit and
/// within `kept` is kept whole, and its letter can be replayed once the limit
/// is raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The payload's size as consumed.
    pub payload_bytes: usize,
    /// The headers' size as consumed, as [`headers_bytes`] counts it.
    pub headers_bytes: usize,
    /// The key's size as consumed (kept only if at most `kept`).
    pub key_bytes: usize,
    /// What the host keeps of a record's payload, and of its headers.
    pub kept: usize,
}

/// A record is kept whole up to this size even past its handler's limit:
/// the built-in team ceiling of `limits.max_payload_bytes` (the pipeline
/// checks the two agree), so a team can raise its limit that far and replay
/// what was parked.
pub const KEPT_AT_LEAST: usize = 4 * 1024 * 1024;

impl Cut {
    /// What the host keeps of a record for a handler whose limit is `limit`.
    pub fn kept_for(limit: usize) -> usize {
        limit.max(KEPT_AT_LEAST)
    }

    /// The record's size as consumed: key, payload and headers.
    pub fn record_bytes(&self) -> usize {
        self.payload_bytes
            .saturating_add(self.headers_bytes)
            .saturating_add(self.key_bytes)
    }

    /// Why the record was not run, for its dead letter.
    pub fn reason(&self) -> String {
        let what = if self.payload_bytes > self.kept {
            format!("the payload is {} bytes", self.payload_bytes)
        } else if self.headers_bytes == usize::MAX {
            "its headers could not be read (more than 100,000, or malformed)".to_owned()
        } else if self.headers_bytes > self.kept {
            format!("the headers are {} bytes", self.headers_bytes)
        } else {
            format!("the key is {} bytes", self.key_bytes)
        };
        format!(
            "limit limits.max_payload_bytes exceeded: {what}, past the {} bytes the host keeps of a record, so \
             the letter keeps only its first part (and no key past that) and cannot be replayed; the record \
             is still in Kafka at its offset",
            self.kept
        )
    }
}

/// What the host holds for each header besides its name and value (a
/// `String` and a `Vec`): a record of a megabyte of empty headers is some
/// 24 MB in memory. [`Record::bytes`] counts it, and so do an outbox
/// message's bytes and `limits.max_outbox_bytes`.
pub const HEADER_OVERHEAD: usize = 48;

/// What the host holds for `headers`: names, values and [`HEADER_OVERHEAD`] each.
pub fn headers_bytes(headers: &[(String, Vec<u8>)]) -> usize {
    headers
        .iter()
        .map(|(n, v)| HEADER_OVERHEAD + n.len() + v.len())
        .sum()
}

/// What the allocator holds for `len` bytes on the heap: glibc's malloc
/// keeps 8 bytes of its own beside each block, rounds to 16 and gives no
/// block under 32, so a header named `a` with value `b` holds 112 bytes,
/// not 50 (issue 23, fifth read: counting lengths undercounted a record of
/// small headers 2-3x). An empty `String` or `Vec` allocates nothing.
///
/// Only a record's size counts this way: an outbox message's size is also
/// `limits.max_outbox_bytes` and the relay's SQL bound, which count lengths,
/// and its headers are at most 64.
fn heap_bytes(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len.saturating_add(8 + 15) & !15).max(32)
    }
}

/// What the host holds for a record besides its parts.
const RECORD_OVERHEAD: usize = 128;

impl Record {
    /// What the host holds for it, in bytes: what bounds a partition's buffer.
    pub fn bytes(&self) -> usize {
        RECORD_OVERHEAD
            + heap_bytes(self.topic.len())
            + heap_bytes(self.key.as_ref().map_or(0, Vec::len))
            + heap_bytes(self.payload.len())
            + self
                .headers
                .iter()
                .map(|(n, v)| HEADER_OVERHEAD + heap_bytes(n.len()) + heap_bytes(v.len()))
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 23, fourth read): a partition's buffer was bounded
    /// in records only, and empty headers weighed nothing, where the host
    /// holds 48 bytes for each.
    #[test]
    fn a_records_bytes_count_what_the_host_holds_for_its_headers() {
        let record = |headers: usize| Record {
            topic: "orders".into(),
            partition: 0,
            offset: 0,
            key: Some(b"k".to_vec()),
            payload: vec![0; 1000],
            headers: vec![(String::new(), Vec::new()); headers],
            timestamp_ms: None,
            cut: None,
        };
        assert_eq!(record(0).bytes(), RECORD_OVERHEAD + 32 + 32 + 1008);
        assert_eq!(record(1000).bytes() - record(0).bytes(), 1000 * HEADER_OVERHEAD);
        assert!(record(1 << 20).bytes() > 48 << 20, "a million empty headers");
        let small = vec![("a".to_string(), b"b".to_vec()); 1000];
        let with = |headers| Record { headers, ..record(0) }.bytes() - record(0).bytes();
        assert_eq!(with(small), 1000 * (HEADER_OVERHEAD + 32 + 32));
    }
}
