//! Failpoints: named places where a test can make the host die on purpose.
//!
//! `INBOXD_FAILPOINTS=relay-before-publish,relay-after-publish` makes the
//! process abort (as a SIGKILL would) at those points, so tests can crash the
//! host exactly between two steps whose order matters. Unset, every check is a
//! single load of a cached empty list.

use std::sync::OnceLock;

fn armed() -> &'static [String] {
    static ARMED: OnceLock<Vec<String>> = OnceLock::new();
    ARMED.get_or_init(|| {
        std::env::var("INBOXD_FAILPOINTS")
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Aborts the process if the failpoint `name` is armed.
pub fn hit(name: &str) {
    if armed().iter().any(|armed| armed == name) {
        eprintln!("inboxd: failpoint {name} hit: aborting");
        std::process::abort();
    }
}
