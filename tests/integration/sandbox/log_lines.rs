//! A guest's text in the host's log: one event, one line.

use crate::support::*;
use serde_json::json;
use std::time::Duration;

/// Regression (issue 23, the forty-eighth and forty-ninth reads): a guest's
/// log line or output with a line break (or a vertical tab, NEL, or an
/// escape sequence a terminal acts on) printed, in the host's text log,
/// what looked like a line of the host's own naming another handler. Now
/// every control character is escaped, whoever logs the text.
#[tokio::test]
async fn a_guest_cannot_forge_a_line_of_the_hosts_log() {
    let topic = unique("forged-logs");
    create_topic(&topic, 1).await;
    let env = TestEnv::new(Backend::Sqlite, "hostile", &topic, "").await;
    let forged = "2026-12-07T10:00:00.000000Z  INFO guest: handler=\"payments\" version=7: refund issued";
    let message = format!("ok\n{forged}\r\u{2028}{forged}\x0b{forged}\u{85}\x1b[2K");
    let ends = produce(
        &topic,
        &[Send::json(
            &new_id(),
            json!({ "attack": "log", "message": message }),
        )],
    )
    .await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(60), &mut host)
        .await;
    let log = host.log();
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));
    let forged_lines: Vec<&str> = log.lines().filter(|line| line.starts_with(forged)).collect();
    assert!(forged_lines.is_empty(), "forged lines: {forged_lines:#?}\n{log}");
    // Both the log call and the guest's stdout reached the log, escaped.
    let escaped = format!("ok\\n{forged}\\r\\u{{2028}}{forged}\\x0b{forged}\\u{{85}}\\x1b[2K");
    assert_eq!(log.matches(&escaped).count(), 2, "{log}");
    // No control character but a tab reaches the log raw (the host's own
    // format writes no colours).
    let raw: Vec<&str> = log
        .lines()
        .filter(|line| line.chars().any(|c| c.is_control() && c != '\t'))
        .collect();
    assert!(raw.is_empty(), "{raw:#?}");
}
