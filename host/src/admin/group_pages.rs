//! A dead-letter group's members, a page per call.
//!
//! A group is computed from every parked letter of the caller's handlers
//! (`db::dead_letter_groups`), and a call replays or discards at most
//! [`GROUP_PAGE`] of its members. Computing the group again at every page
//! made draining a group of N letters read O(N²) of them (issue 23, the
//! twenty-first read: three million letters without an id cost a producer
//! nothing). So a call keeps the members after its page, up to
//! [`KEPT_MEMBERS`], for its token's next call on that group, which takes
//! its page from there without reading the group. One group is kept per
//! token (8 bytes per member: 8 MB at most), for [`KEPT_FOR`] after its last
//! use. Letters parked after the group was read join it once what was kept
//! runs out (the group is read again then); a member resolved meanwhile is
//! reported as such by the call that reaches it, as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Members replayed or discarded by one call on a group, at most: each
/// outcome is kept for the answer, and a group of three million letters
/// without an id (free for a producer to make) was gigabytes of outcomes
/// (the twentieth read). The group keeps its id while members remain: a
/// client calls again for the next ones.
pub const GROUP_PAGE: usize = 1_000;

/// Members kept for a token's next calls, at most (past them, the group is
/// read again when they run out).
pub const KEPT_MEMBERS: usize = 1_000_000;

/// How long members are kept after the token's last call on the group.
pub const KEPT_FOR: Duration = Duration::from_secs(300);

/// Per token: the group whose members are kept, and what is left of them.
#[derive(Default)]
pub struct GroupPages(Mutex<HashMap<String, Kept>>);

struct Kept {
    group: String,
    /// Oldest last, so a page is taken from the end.
    members: Vec<i64>,
    used_at: Instant,
}

impl GroupPages {
    /// The next page of `group` for `token` from what its earlier call
    /// kept; `None` when nothing is kept (read the group, then [`Self::page`]).
    pub fn next(&self, token: &str, group: &str) -> Option<Vec<i64>> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|_, k| k.used_at.elapsed() < KEPT_FOR);
        let entry = kept
            .get_mut(token)
            .filter(|k| k.group == group && !k.members.is_empty())?;
        let from = entry.members.len().saturating_sub(GROUP_PAGE);
        let mut page = entry.members.split_off(from);
        page.reverse();
        entry.used_at = Instant::now();
        if entry.members.is_empty() {
            kept.remove(token);
        }
        Some(page)
    }

    /// The first page of `members` (a group just read, oldest first); the
    /// rest, up to [`KEPT_MEMBERS`], is kept for `token`'s next call on
    /// `group` (in place of any other group it kept).
    pub fn page(&self, token: &str, group: &str, mut members: Vec<i64>) -> Vec<i64> {
        members.truncate(GROUP_PAGE + KEPT_MEMBERS);
        let mut rest = members.split_off(members.len().min(GROUP_PAGE));
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if rest.is_empty() {
            kept.remove(token);
        } else {
            rest.reverse();
            rest.shrink_to_fit();
            kept.insert(
                token.to_owned(),
                Kept {
                    group: group.to_owned(),
                    members: rest,
                    used_at: Instant::now(),
                },
            );
        }
        members
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group read once is paged from what was kept, oldest first, until
    /// nothing is left; another token or group reads its own.
    #[test]
    fn a_group_is_read_once_and_paged_from_what_was_kept() {
        let pages = GroupPages::default();
        let members: Vec<i64> = (1..=2_500).collect();
        assert_eq!(pages.next("team", "g1"), None, "nothing kept yet");
        let first = pages.page("team", "g1", members);
        assert_eq!(first, (1..=1_000).collect::<Vec<_>>());
        assert_eq!(pages.next("other", "g1"), None, "another token's");
        assert_eq!(pages.next("team", "g2"), None, "another group");
        assert_eq!(pages.next("team", "g1"), Some((1_001..=2_000).collect()));
        assert_eq!(pages.next("team", "g1"), Some((2_001..=2_500).collect()));
        assert_eq!(pages.next("team", "g1"), None, "read again when used up");

        // A group of one page keeps nothing; a new group replaces the old.
        pages.page("team", "g1", (1..=1_500).collect());
        assert_eq!(pages.page("team", "g3", vec![7]), vec![7]);
        assert_eq!(pages.next("team", "g1"), None);
    }

    /// At most [`KEPT_MEMBERS`] are kept past the first page.
    #[test]
    fn what_is_kept_is_bounded() {
        let pages = GroupPages::default();
        let members: Vec<i64> = (0..(GROUP_PAGE + KEPT_MEMBERS + 5) as i64).collect();
        pages.page("team", "g", members);
        let mut paged = 0;
        while let Some(page) = pages.next("team", "g") {
            paged += page.len();
        }
        assert_eq!(paged, KEPT_MEMBERS);
    }
}
