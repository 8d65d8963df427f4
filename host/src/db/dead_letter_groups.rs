//! Dead letters in groups: one row per handler, reason kind and reason
//! *pattern* (the reason with its numbers, ids and quoted values masked), so
//! 5,000 events parked for one cause are one thing to look at and one
//! action to take (`inboxd dlq groups`, `/v1/dead-letters/groups`, the
//! console's dead letters page).
//!
//! Groups are computed when read, from the parked dead letters' summaries
//! (no record is read), so every dead letter a host ever wrote is grouped
//! the same way and nothing is stored twice. A group's id is a digest of
//! what makes it one, so it stays the same between reads while its members
//! come and go.

use super::dead_letters::{self, Filter, ReasonKind, Row};
use super::{Database, DbError};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// What a pattern keeps of a reason: longer reasons that agree this far
/// are one group (a guest's reason is text of its own choosing).
pub const PATTERN_CHARS: usize = 500;

/// The mask for a word that holds a digit (a number, an id, a count).
const NUMBER_MASK: char = '#';
/// What stands between the quotes of a masked quoted value.
const QUOTED_MASK: char = '…';

/// Part of a word: a run of these is masked whole when it holds a digit,
/// so `order-42`, `3.5`, `e7a1-…` (a UUID) and `0x1f` each become one `#`.
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')
}

/// `reason` with its variable parts masked: a quoted value (`'…'`, `"…"`,
/// `` `…` ``; a quote right after a letter is an apostrophe, not a quote)
/// and a word holding a digit (`#`). Two reasons that differ only there
/// have one pattern.
pub fn pattern(reason: &str) -> String {
    let chars: Vec<char> = reason.chars().collect();
    let mut out = String::new();
    // Characters in `out`, and the quote characters known to have no closing
    // one ahead: each is scanned for at most once, so a reason full of
    // unclosed quotes costs its length, not its length squared.
    let mut len = 0;
    let mut unclosed: Vec<char> = Vec::new();
    let mut i = 0;
    while i < chars.len() && len < PATTERN_CHARS {
        let c = chars[i];
        if matches!(c, '\'' | '"' | '`')
            && !(i > 0 && chars[i - 1].is_alphanumeric())
            && !unclosed.contains(&c)
        {
            match quoted_len(&chars[i + 1..], c) {
                Some(quoted) => {
                    out.extend([c, QUOTED_MASK, c]);
                    len += 3;
                    i += quoted + 2;
                    continue;
                }
                None => unclosed.push(c),
            }
        }
        if !is_word(c) {
            out.push(c);
            len += 1;
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_word(chars[i]) {
            i += 1;
        }
        // A word's trailing dots and colons end a sentence or a label.
        let word = &chars[start..i];
        let end = word.len() - word.iter().rev().take_while(|c| matches!(c, '.' | ':')).count();
        if word[..end].iter().any(char::is_ascii_digit) {
            out.push(NUMBER_MASK);
            len += 1;
        } else {
            out.extend(&word[..end]);
            len += end;
        }
        out.extend(&word[end..]);
        len += word.len() - end;
    }
    out.chars().take(PATTERN_CHARS).collect()
}

/// Characters up to the closing `quote` in `rest` (a backslash escapes the
/// next one, as Rust's and JSON's quoting write it); `None` if it never closes.
fn quoted_len(rest: &[char], quote: char) -> Option<usize> {
    let mut escaped = false;
    for (i, &c) in rest.iter().enumerate() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            _ if c == quote => return Some(i),
            _ => {}
        }
    }
    None
}

/// A group's id: the first 16 hex digits of a digest of its handler, kind
/// and pattern (stable across reads and hosts).
pub fn group_id(handler: &str, kind: ReasonKind, pattern: &str) -> String {
    let mut digest = Sha256::new();
    for part in [handler, kind.as_str(), pattern] {
        digest.update(part.as_bytes());
        digest.update([0]);
    }
    hex::encode(&digest.finalize()[..8])
}

/// Parked dead letters of one handler, kind and reason pattern.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Group {
    pub id: String,
    pub handler: String,
    pub kind: ReasonKind,
    pub pattern: String,
    pub count: usize,
    pub first_failed_at: i64,
    pub last_failed_at: i64,
    /// The oldest member, to show a whole reason and open one record.
    pub example_id: i64,
    pub example_reason: String,
    /// Every member's id, oldest first (the first [`MEMBERS_SHOWN`] when
    /// serialized: a group of 100,000 is not 100,000 ids in every answer).
    #[serde(serialize_with = "first_members")]
    pub members: Vec<i64>,
}

/// Member ids a serialized group lists, at most; `count` has them all.
pub const MEMBERS_SHOWN: usize = 1000;

fn first_members<S: serde::Serializer>(members: &[i64], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(members.iter().take(MEMBERS_SHOWN))
}

/// Groups kept per handler and reason kind, at most; that handler's letters
/// of that kind with further patterns go to one overflow group
/// ([`OVERFLOW_PATTERN`]). A reason is a guest's own text, so a team can
/// make every reason a pattern of its own: a million of them were a million
/// groups of up to 2.5 KB each. Per handler and kind, so one team's reasons
/// never push another's letters into an overflow, and a group's id does not
/// depend on what else a read selects.
pub const MAX_GROUPS: usize = 1_000;

/// The pattern of the overflow group (see [`MAX_GROUPS`]).
pub const OVERFLOW_PATTERN: &str = "(other reasons: inboxd keeps at most 1,000 groups per handler and kind)";

/// Summaries read at a time: groups are folded page by page, so a million
/// parked letters (2.3 KB of summary each) are never held at once.
const PAGE: u32 = 5_000;

/// The parked dead letters `filter` selects, grouped: the largest group
/// first, then the most recent. `filter.include_resolved` and `limit` are
/// ignored (a group is of parked letters, all of them).
pub async fn groups(db: &Database, filter: &Filter<'_>) -> Result<Vec<Group>, DbError> {
    let mut grouping = Grouping::default();
    let mut after_id = None;
    loop {
        let page = Filter {
            include_resolved: false,
            limit: Some(PAGE),
            without_record: true,
            after_id,
            ..*filter
        };
        let rows = dead_letters::find(db, &page).await?;
        let (Some(last), full) = (rows.last().map(|r| r.id), rows.len() == PAGE as usize) else {
            break;
        };
        after_id = Some(last);
        // Masking many reasons is CPU work: off the async workers.
        // (A panic there is the host's bug; it ends only the request that met it.)
        grouping = tokio::task::spawn_blocking(move || {
            grouping.add(rows);
            grouping
        })
        .await
        .expect("grouping dead letters panicked");
        if !full {
            break;
        }
    }
    Ok(grouping.finish())
}

/// [`groups`] over rows already read (oldest first, as `find` returns them).
pub fn group_rows(rows: Vec<Row>) -> Vec<Group> {
    let mut grouping = Grouping::default();
    grouping.add(rows);
    grouping.finish()
}

/// Groups being folded, page by page.
#[derive(Default)]
struct Grouping {
    groups: Vec<Group>,
    index: HashMap<String, usize>,
    /// Groups made per (handler, kind).
    made: HashMap<(String, ReasonKind), usize>,
}

impl Grouping {
    fn add(&mut self, rows: Vec<Row>) {
        for row in rows {
            let mut pattern = pattern(&row.reason);
            let mut id = group_id(&row.handler, row.kind, &pattern);
            if !self.index.contains_key(&id) {
                let made = self.made.entry((row.handler.clone(), row.kind)).or_default();
                if *made >= MAX_GROUPS {
                    pattern = OVERFLOW_PATTERN.to_owned();
                    id = group_id(&row.handler, row.kind, &pattern);
                } else {
                    *made += 1;
                }
            }
            match self.index.get(&id) {
                Some(&at) => {
                    let group = &mut self.groups[at];
                    group.count += 1;
                    group.first_failed_at = group.first_failed_at.min(row.first_failed_at);
                    group.last_failed_at = group.last_failed_at.max(row.last_failed_at);
                    group.members.push(row.id);
                }
                None => {
                    self.index.insert(id.clone(), self.groups.len());
                    self.groups.push(Group {
                        id,
                        handler: row.handler,
                        kind: row.kind,
                        pattern,
                        count: 1,
                        first_failed_at: row.first_failed_at,
                        last_failed_at: row.last_failed_at,
                        example_id: row.id,
                        example_reason: row.reason,
                        members: vec![row.id],
                    });
                }
            }
        }
    }

    fn finish(self) -> Vec<Group> {
        let mut groups = self.groups;
        groups.sort_by(|a, b| (b.count, b.last_failed_at, &a.id).cmp(&(a.count, a.last_failed_at, &b.id)));
        groups
    }
}

/// The group with `id` among those `filter` selects, if any.
pub async fn group(db: &Database, filter: &Filter<'_>, id: &str) -> Result<Option<Group>, DbError> {
    Ok(groups(db, filter).await?.into_iter().find(|g| g.id == id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::dead_letters::{DeadLetter, insert, resolve};
    use crate::db::now_ms;
    use crate::db::test_support::each_backend;

    #[test]
    fn numbers_ids_and_quoted_values_are_masked() {
        for (reason, expected) in [
            ("attempt 2 of 3", "attempt # of #"),
            ("attempt 17 of 40", "attempt # of #"),
            (
                "order ord-42 failed after 3.5 s: id 6f1c2e0a-5b7d-4c1e-9a3f-0d2b8e7c6a51",
                "order # failed after # s: id #",
            ),
            (r#"unknown attack "sleep""#, r#"unknown attack "…""#),
            (r#"unknown attack "a \"b\" c""#, r#"unknown attack "…""#),
            ("column 'email' can't be null", "column '…' can't be null"),
            ("value `x` at offset 12.", "value `…` at offset #."),
            ("handler's limit", "handler's limit"),
            ("an unclosed \"quote 12", "an unclosed \"quote #"),
            (
                "amount_cents must not be negative",
                "amount_cents must not be negative",
            ),
            ("", ""),
        ] {
            assert_eq!(pattern(reason), expected, "{reason:?}");
        }
        let long = format!("{} 1", "x".repeat(PATTERN_CHARS * 2));
        assert_eq!(pattern(&long).chars().count(), PATTERN_CHARS);
        // Unclosed quotes everywhere: each kind is looked for once.
        let quotes = "\"\\".repeat(50_000);
        assert_eq!(pattern(&quotes).chars().count(), PATTERN_CHARS);
    }

    #[test]
    fn a_groups_id_is_its_handler_kind_and_pattern() {
        let a = group_id("billing", ReasonKind::Rejected, "attempt # of #");
        assert_eq!(a.len(), 16);
        assert_eq!(a, group_id("billing", ReasonKind::Rejected, "attempt # of #"));
        assert_ne!(a, group_id("billing", ReasonKind::Limit, "attempt # of #"));
        assert_ne!(a, group_id("emails", ReasonKind::Rejected, "attempt # of #"));
        // The separator keeps "ab" + "c" apart from "a" + "bc".
        assert_ne!(
            group_id("ab", ReasonKind::Rejected, "c"),
            group_id("a", ReasonKind::Rejected, "bc")
        );
    }

    #[tokio::test]
    async fn parked_dead_letters_are_grouped_by_handler_kind_and_pattern() {
        for db in each_backend().await {
            let mut tx = db.begin().await.unwrap();
            let letters = [
                ("billing", ReasonKind::RetriesExhausted, "attempt 1 of 3"),
                ("billing", ReasonKind::Rejected, r#"unknown attack "x""#),
                ("billing", ReasonKind::RetriesExhausted, "attempt 2 of 5"),
                ("emails", ReasonKind::RetriesExhausted, "attempt 1 of 3"),
                ("billing", ReasonKind::RetriesExhausted, "attempt 2 of 3"),
                ("billing", ReasonKind::Rejected, r#"unknown attack "y""#),
            ];
            for (offset, (handler, kind, reason)) in letters.into_iter().enumerate() {
                let letter = DeadLetter {
                    handler,
                    event_id: Some("e"),
                    topic: "orders",
                    partition: 0,
                    offset: offset as i64,
                    key: None,
                    payload: b"{}",
                    headers: &[],
                    kind,
                    reason,
                    attempts: 1,
                    handler_version: None,
                    first_failed_at: 1_000 + offset as i64,
                    record_bytes: None,
                };
                insert(&mut tx, &letter).await.unwrap();
            }
            tx.commit().await.unwrap();
            let found = groups(&db, &Filter::default()).await.unwrap();
            let shape: Vec<(&str, &str, usize)> = found
                .iter()
                .map(|g| (g.handler.as_str(), g.pattern.as_str(), g.count))
                .collect();
            assert_eq!(
                shape,
                [
                    ("billing", "attempt # of #", 3),
                    ("billing", r#"unknown attack "…""#, 2),
                    ("emails", "attempt # of #", 1),
                ],
                "{:?}",
                db.backend()
            );
            let retries = &found[0];
            assert_eq!(retries.first_failed_at, 1_000);
            assert_eq!(retries.example_reason, "attempt 1 of 3");
            assert_eq!(retries.members.len(), 3);
            assert!(retries.last_failed_at >= now_ms() - 60_000);

            // A resolved member leaves its group; a scope leaves other handlers out.
            let mut tx = db.begin().await.unwrap();
            assert!(resolve(&mut tx, retries.members[0], "discarded").await.unwrap());
            tx.commit().await.unwrap();
            let emails = ["emails".to_owned()];
            let scoped = Filter {
                handlers: Some(&emails),
                ..Filter::default()
            };
            let scoped = groups(&db, &scoped).await.unwrap();
            assert_eq!(scoped.len(), 1);
            assert_eq!(scoped[0].handler, "emails");
            let again = group(&db, &Filter::default(), &retries.id)
                .await
                .unwrap()
                .expect("the group is still there");
            assert_eq!(again.members, retries.members[1..]);
        }
    }

    /// Regression (issue 23, fourth read): groups were made from every
    /// parked summary read at once, and every distinct reason (a guest's own
    /// text) made a group. Now summaries are read a page at a time, and past
    /// [`MAX_GROUPS`] the rest of a handler's kind goes to one overflow group.
    #[tokio::test]
    async fn groups_are_folded_page_by_page_and_capped() {
        for db in each_backend().await {
            let mut tx = db.begin().await.unwrap();
            let total = PAGE as usize + 3;
            for offset in 0..total {
                let reason = if offset % 2 == 0 {
                    "attempt 1 of 3"
                } else {
                    "unknown attack"
                };
                let letter = DeadLetter {
                    handler: "billing",
                    event_id: Some("e"),
                    topic: "orders",
                    partition: 0,
                    offset: offset as i64,
                    key: None,
                    payload: b"{}",
                    headers: &[],
                    kind: ReasonKind::Rejected,
                    reason,
                    attempts: 1,
                    handler_version: None,
                    first_failed_at: 1_000,
                    record_bytes: None,
                };
                insert(&mut tx, &letter).await.unwrap();
            }
            tx.commit().await.unwrap();
            let groups = groups(&db, &Filter::default()).await.unwrap();
            let counts: Vec<usize> = groups.iter().map(|g| g.count).collect();
            assert_eq!(counts, [total / 2 + 1, total / 2], "{:?}", db.backend());
            assert_eq!(
                groups[0].members.len(),
                total / 2 + 1,
                "every member, across pages"
            );
        }

        // A word per letter of the alphabet, so no two patterns agree.
        let word = |mut n: usize| {
            let mut word = String::new();
            loop {
                word.push((b'a' + (n % 26) as u8) as char);
                n /= 26;
                if n == 0 {
                    return word;
                }
            }
        };
        let rows: Vec<Row> = (0..MAX_GROUPS + 5)
            .map(|i| Row {
                id: i as i64,
                handler: "billing".into(),
                event_id: Some("e".into()),
                topic: "orders".into(),
                partition: 0,
                offset: i as i64,
                key: None,
                payload: Vec::new(),
                headers: Vec::new(),
                kind: ReasonKind::Rejected,
                reason: format!("reason {}", word(i)),
                attempts: 1,
                handler_version: None,
                first_failed_at: 1_000,
                last_failed_at: 1_000,
                resolution: None,
                resolved_at: None,
                record_bytes: None,
            })
            .collect();
        let grouped = group_rows(rows);
        assert_eq!(grouped.len(), MAX_GROUPS + 1);
        assert_eq!(
            (grouped[0].pattern.as_str(), grouped[0].count),
            (OVERFLOW_PATTERN, 5),
            "the largest group: the overflow"
        );
    }
}
