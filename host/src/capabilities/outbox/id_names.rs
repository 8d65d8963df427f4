//! Where consumers take their event id from, by topic, and stamping the
//! host's id into a published message's JSON payload under each of those
//! names: what keeps a publisher from choosing the id its consumer
//! deduplicates on.

use super::lenient;
use crate::config::defaults::EVENT_ID_HEADER;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{LazyLock, RwLock};

/// The headers and top-level JSON fields the handlers this host runs take
/// their event id from (`[handlers.event_id]` of the config file and of every
/// upload it has loaded), besides `event_id`, by the topic they consume. A
/// message's consumer may be any handler of its topic, so the host alone
/// writes these names on a message to that topic: a guest's own are dropped
/// or overwritten with the message's id (issue 23: the relay stamped only
/// `event_id`, and a consumer reading another name deduplicated on a value
/// the publisher chose).
///
/// Regression (the eighteenth adversarial read, issue 23): the names were
/// once one set for every topic, so a team's upload that read its ids from
/// `content-type` and `amount` stripped every other team's `content-type`
/// header and overwrote their `amount` fields. Now a handler's names reach
/// only the messages sent to the topics it consumes.
///
/// Regression (the fifty-third read, issue 23): every version a host loaded
/// added its topics for good, names or none, so a team uploading versions of
/// 256 fresh topic names grew every host's memory without end. Now a handler
/// counts with the names of the version it runs and of the one before (so a
/// message relayed while hosts move between them is stamped for both), and
/// only when it has names besides `event_id`.
#[derive(Default)]
struct IdNames {
    /// Per handler: the id source of the version loaded last, and of the
    /// one before it.
    by_handler: BTreeMap<String, [Option<Source>; 2]>,
    /// What the sources above give each topic (rebuilt at each change).
    by_topic: BTreeMap<String, TopicNames>,
}

/// Where one version of a handler takes its event id from, besides `event_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Source {
    topics: Vec<String>,
    header: Option<String>,
    field: Option<String>,
}

#[derive(Default)]
struct TopicNames {
    /// Header names as configured (a consumer matches its header exactly).
    headers: BTreeSet<String>,
    fields: BTreeSet<String>,
}

impl IdNames {
    fn rebuild(&mut self) {
        self.by_topic.clear();
        for source in self.by_handler.values().flatten().flatten() {
            for topic in &source.topics {
                let names = self.by_topic.entry(topic.clone()).or_default();
                names.headers.extend(source.header.iter().cloned());
                names.fields.extend(source.field.iter().cloned());
            }
        }
    }
}

static ID_NAMES: LazyLock<RwLock<IdNames>> = LazyLock::new(RwLock::default);

/// Registers where `handler`, consuming `topics`, takes its event id from
/// (see [`IdNames`]), in place of what its version before the last one
/// registered.
pub fn register_id_source(handler: &str, topics: &[String], header: &str, json_field: &str) {
    let source = Source {
        topics: topics.to_vec(),
        header: (!is_default_id_header(header)).then(|| header.to_owned()),
        field: (json_field != EVENT_ID_HEADER).then(|| json_field.to_owned()),
    };
    let source = (source.header.is_some() || source.field.is_some()).then_some(source);
    let mut names = ID_NAMES.write().unwrap_or_else(|p| p.into_inner());
    let versions = names.by_handler.entry(handler.to_owned()).or_default();
    if versions[0] == source {
        return;
    }
    versions[1] = std::mem::replace(&mut versions[0], source);
    if versions.iter().all(Option::is_none) {
        names.by_handler.remove(handler);
    }
    names.rebuild();
}

/// Forgets where deleted handler `handler` took its event id from: a team
/// that uploaded and deleted handlers of fresh names, each with 256 topics,
/// grew every host's registry for good (the review of the fifty-third read).
pub fn forget_id_source(handler: &str) {
    let mut names = ID_NAMES.write().unwrap_or_else(|p| p.into_inner());
    if names.by_handler.remove(handler).is_some() {
        names.rebuild();
    }
}

/// `topic`'s registered names, headers or fields.
fn registered(topic: &str, pick: fn(&TopicNames) -> &BTreeSet<String>) -> Vec<String> {
    let names = ID_NAMES.read().unwrap_or_else(|p| p.into_inner());
    names
        .by_topic
        .get(topic)
        .map(|n| pick(n).iter().cloned().collect())
        .unwrap_or_default()
}

/// A message's headers, name and value.
pub type Headers = Vec<(String, Vec<u8>)>;

/// A message as the relay sends it to `topic`: each header and top-level
/// JSON field registered for the topic *now*, on this host, set to the
/// message's id `id` (what the guest wrote under such a name dropped);
/// `None` when none is (the message goes out as it was stored).
///
/// `publish` stamps the names registered when it runs, on the host it runs
/// on. A name an operator gives a topic's consumer later, or one registered
/// only on hosts where that consumer loaded, would leave messages already
/// written, or written elsewhere, with the publisher's own value under it
/// (the twenty-fifth read). Names not registered here are left as stored:
/// the publishing host stamped them, and stripping them would take a
/// consumer's id away.
pub fn restamped(
    topic: &str,
    id: &str,
    headers: &[(String, Vec<u8>)],
    payload: &[u8],
) -> Option<(Headers, Vec<u8>)> {
    let (names, fields) = {
        let registered = ID_NAMES.read().unwrap_or_else(|p| p.into_inner());
        let names = registered.by_topic.get(topic)?;
        (names.headers.clone(), names.fields.clone())
    };
    if names.is_empty() && fields.is_empty() {
        return None;
    }
    let ours = |name: &str| names.iter().any(|h| h.trim().eq_ignore_ascii_case(name.trim()));
    let mut out: Vec<(String, Vec<u8>)> = headers.iter().filter(|(n, _)| !ours(n)).cloned().collect();
    out.extend(names.iter().map(|n| (n.clone(), id.as_bytes().to_vec())));
    let payload = if fields.is_empty() {
        payload.to_vec()
    } else {
        // Publish checked the payload; one it could not stamp never got here.
        stamp_json_id(topic, payload.to_vec(), id).unwrap_or_else(|_| payload.to_vec())
    };
    Some((out, payload))
}

/// The header names registered for `topic` (besides `event_id`): the host
/// writes the message's id under each.
pub(super) fn id_headers(topic: &str) -> Vec<String> {
    registered(topic, |n| &n.headers)
}

/// Whether a header name is one a consumer of `topic` may take the event id
/// from: a spelling of `event_id` (see [`is_default_id_header`]) or one
/// registered for the topic. Such headers are the host's.
pub fn is_id_header(topic: &str, name: &str) -> bool {
    let name = name.trim();
    is_default_id_header(name)
        || registered(topic, |n| &n.headers)
            .iter()
            .any(|h| h.trim().eq_ignore_ascii_case(name))
}

/// Whether a header name reads as the event id: `event_id` in any case, with
/// `-`, `.` or ` ` for `_`, and with an `x-` prefix.
fn is_default_id_header(name: &str) -> bool {
    let name = name.trim();
    let bare = name
        .get(..2)
        .filter(|prefix| prefix.eq_ignore_ascii_case("x-") || prefix.eq_ignore_ascii_case("x_"))
        .map_or(name, |_| &name[2..]);
    let normalised: String = bare
        .chars()
        .map(|c| match c {
            '-' | '.' | ' ' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    normalised == EVENT_ID_HEADER || normalised == "eventid"
}

/// The payload with its top-level JSON `event_id` field set to `id`, if it is
/// a JSON object; anything else is returned untouched. Every top-level copy of
/// the field is removed (a consumer may keep the first or the last) and one
/// is written first; so are the fields registered for `topic` (see
/// [`IdNames`]) that the payload has. The other members keep their text.
///
/// Refused: a payload that a consumer's JSON reader may take for an object
/// but that is not one the host can stamp (see [`lenient`]): not strict
/// JSON (RFC 8259: `NaN`, comments, a prefix, trailing bytes) or not UTF-8
/// without a byte-order mark. Such a payload once went out untouched, its
/// guest-chosen top-level `event_id` with it (the sixth read of this
/// round, issue 23).
pub fn stamp_json_id(topic: &str, payload: Vec<u8>, id: &str) -> Result<Vec<u8>, String> {
    let (encoding, text) = lenient::decode(&payload);
    if !lenient::object_start(text) {
        // Not an object to any reader (nor to a strict one): untouched.
        return Ok(payload);
    }
    if let Some(encoding) = encoding {
        return Err(format!(
            "the payload reads as a JSON object in {encoding}; a JSON payload must be UTF-8 without a \
             byte-order mark (RFC 8259), so the host can set its event_id field"
        ));
    }
    // serde_json does not check the UTF-8 of strings it skips, and a
    // reader that drops invalid bytes read `event_\xffid` as `event_id`.
    if let Err(e) = std::str::from_utf8(&payload) {
        return Err(format!(
            "the payload reads as a JSON object but is not valid UTF-8 ({e}); the host sets a JSON \
             object's top-level event_id, so it refuses one it cannot read"
        ));
    }
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&payload) {
        return Err(format!(
            "the payload reads as a JSON object to a lenient reader but is not strict JSON (RFC 8259): \
             {e}; the host sets a JSON object's top-level event_id, so it refuses one it cannot read"
        ));
    }
    // Strict JSON starting with `{` now: stamped without a second check.
    Ok(stamp_object(payload, id, &registered(topic, |n| &n.fields)))
}

/// `a` and `b` are the same name to a reader that ignores case: each
/// character compared by its simple upper-, then lower-case form, so `ſ`
/// is `s`, `K` (Kelvin) is `k` and `ı` is `i`, as Go's `encoding/json`
/// (which matches keys case-insensitively, the last one winning) and .NET's
/// `OrdinalIgnoreCase` have them (the seventh read of this round:
/// `{"EVENT_ID": ...}` went out beside the host's `event_id`).
fn same_folded(a: &str, b: &str) -> bool {
    a.chars().map(fold).eq(b.chars().map(fold))
}

/// One character as readers that ignore case compare it: its simple upper
/// case, then the first character of that one's lower case (`İ` is `i`, as
/// Java's `equalsIgnoreCase` has it: the ninth read of this round).
fn fold(c: char) -> char {
    // The same for ASCII, without Unicode's tables: almost every key.
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    let mut upper = c.to_uppercase();
    match (upper.next(), upper.next()) {
        (Some(u), None) => u.to_lowercase().next().unwrap_or(u),
        _ => c,
    }
}

/// Whether a JSON key reads as the event id to some consumer: `event_id` in
/// any case, and every spelling a header may have (`eventId`, `event-id`,
/// `X-Event-Id`: camel-case and kebab-case mappers read those).
fn reads_as_event_id(key: &str) -> bool {
    // `eventid` to `x-event_id`, blanks around aside (folding keeps the
    // count of characters): most keys are told apart here, unfolded.
    if !(7..=10).contains(&key.trim().chars().count()) {
        return false;
    }
    let folded: String = key.chars().map(fold).collect();
    is_default_id_header(&folded)
}

/// [`stamp_json_id`] with `others` as the registered fields, of a payload
/// known to be strict JSON that starts with `{`.
///
/// Two passes over the members, one to find which registered fields the
/// payload has and one to write: the host holds the payload and its
/// stamped copy, nothing per member (a list of members and their names was
/// about 15 times a payload of many small members).
pub(super) fn stamp_object(payload: Vec<u8>, id: &str, others: &[String]) -> Vec<u8> {
    // A key's text is at most 6 bytes per character (`\uXXXX`) and its
    // quotes: a longer one cannot be a field to stamp, and is not decoded.
    let longest = others
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .max(EVENT_ID_HEADER.len());
    // The name a key stands for, in any case: every such key is dropped and
    // the name written once, with the id.
    let stamped_name = |key: &[u8]| -> Option<String> {
        let name: String = (key.len() <= (longest + 2) * 6 + 2)
            .then(|| serde_json::from_slice(key).ok())
            .flatten()?;
        if reads_as_event_id(&name) {
            return Some(EVENT_ID_HEADER.to_owned());
        }
        others
            .iter()
            .find(|candidate| same_folded(&name, candidate))
            .cloned()
    };
    let mut stamped: Vec<String> = vec![EVENT_ID_HEADER.to_owned()];
    let found = json::for_each_member(&payload, |key, _| {
        if let Some(name) = stamped_name(&payload[key])
            && !stamped.contains(&name)
        {
            stamped.push(name);
        }
    });
    if found.is_none() {
        return payload;
    }
    let value = serde_json::to_string(id).expect("a string serializes");
    let mut out = Vec::with_capacity(payload.len() + stamped.len() * (value.len() + 16) + 2);
    out.push(b'{');
    for (i, field) in stamped.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(
            serde_json::to_string(field)
                .expect("a string serializes")
                .as_bytes(),
        );
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
    }
    json::for_each_member(&payload, |key, value| {
        if stamped_name(&payload[key.clone()]).is_none() {
            out.push(b',');
            out.extend_from_slice(&payload[key.start..value.end]);
        }
    });
    out.push(b'}');
    out
}

/// Just enough of a JSON reader to find a valid document's top-level members.
pub(super) mod json {
    use std::ops::Range;

    fn skip_blank(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    }

    /// `i` is at an opening quote; returns the index after the closing one.
    fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
        i += 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                _ => i += 1,
            }
        }
        None
    }

    /// `i` is at a value's first byte; returns the index after its last.
    fn skip_value(b: &[u8], mut i: usize) -> Option<usize> {
        match *b.get(i)? {
            b'"' => skip_string(b, i),
            b'{' | b'[' => {
                let mut depth = 0usize;
                while i < b.len() {
                    match b[i] {
                        b'"' => {
                            i = skip_string(b, i)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(i + 1);
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                None
            }
            _ => {
                while i < b.len() && !matches!(b[i], b',' | b'}' | b']') && !b[i].is_ascii_whitespace() {
                    i += 1;
                }
                Some(i)
            }
        }
    }

    /// Calls `member` with the key (quotes included) and value ranges of each
    /// top-level member of a document already known to be valid JSON whose
    /// first non-blank byte is `{`, in order; `None` if it is not one.
    pub fn for_each_member(b: &[u8], mut member: impl FnMut(Range<usize>, Range<usize>)) -> Option<()> {
        let mut i = skip_blank(b, 0);
        if b.get(i) != Some(&b'{') {
            return None;
        }
        i = skip_blank(b, i + 1);
        if b.get(i) == Some(&b'}') {
            return Some(());
        }
        loop {
            let key_end = skip_string(b, i)?;
            let key = i..key_end;
            i = skip_blank(b, key_end);
            if b.get(i) != Some(&b':') {
                return None;
            }
            let value_start = skip_blank(b, i + 1);
            let value_end = skip_value(b, value_start)?;
            member(key, value_start..value_end);
            i = skip_blank(b, value_end);
            match b.get(i)? {
                b',' => i = skip_blank(b, i + 1),
                b'}' => return Some(()),
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics_of(handler: &str) -> Vec<String> {
        let names = ID_NAMES.read().unwrap();
        names.by_handler.get(handler).map_or_else(Vec::new, |versions| {
            versions.iter().flatten().flat_map(|s| s.topics.clone()).collect()
        })
    }

    /// Regression (the fifty-third read, issue 23): each version's topics
    /// stayed registered for good, with or without names, so uploads of
    /// fresh topic names grew every host's memory without end.
    #[test]
    fn a_handler_holds_the_names_of_its_last_two_versions_only() {
        let topic = |v: usize| format!("bound-test-{v}");
        for v in 0..50 {
            register_id_source("bounded", &[topic(v)], "x-bound-ref", EVENT_ID_HEADER);
        }
        assert_eq!(topics_of("bounded"), [topic(49), topic(48)]);
        assert_eq!(id_headers(&topic(49)), ["x-bound-ref"]);
        assert_eq!(
            id_headers(&topic(48)),
            ["x-bound-ref"],
            "the version before still counts"
        );
        assert!(id_headers(&topic(47)).is_empty());
        let registered = ID_NAMES.read().unwrap().by_topic.contains_key(&topic(10));
        assert!(!registered, "an old version's topic is forgotten");
        // Default names register nothing, however many topics.
        for v in 0..50 {
            register_id_source(
                "defaults",
                &[format!("plain-{v}")],
                EVENT_ID_HEADER,
                EVENT_ID_HEADER,
            );
        }
        assert!(topics_of("defaults").is_empty());
        assert!(!ID_NAMES.read().unwrap().by_topic.contains_key("plain-49"));
        // Back to default names: the last named version still counts (a
        // load of the same source again is no new version).
        register_id_source("bounded", &[topic(50)], EVENT_ID_HEADER, EVENT_ID_HEADER);
        register_id_source("bounded", &[topic(51)], EVENT_ID_HEADER, EVENT_ID_HEADER);
        assert_eq!(topics_of("bounded"), [topic(49)]);
        register_id_source("bounded", &[topic(52)], "x-other-ref", EVENT_ID_HEADER);
        assert_eq!(topics_of("bounded"), [topic(52)]);
        assert!(!ID_NAMES.read().unwrap().by_topic.contains_key(&topic(49)));
        // A deleted handler's names go with it.
        forget_id_source("bounded");
        assert!(topics_of("bounded").is_empty());
        assert!(id_headers(&topic(52)).is_empty());
    }
}
