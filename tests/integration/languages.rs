//! The billing handler in Rust (on the `inboxd-guest` SDK), Python
//! (componentize-py) and JavaScript (jco), through the same behaviour on
//! both backends: duplicates skipped, bad payloads rejected, writes inside
//! the host's transaction (a failure after the insert leaves no invoice),
//! and an unhandled exception parked with its traceback or stack.

use crate::support::*;
use inboxd::db::dead_letters::{self, Filter};
use serde_json::json;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Language {
    Rust,
    Python,
    JavaScript,
}

impl Language {
    fn component(self) -> &'static str {
        match self {
            Language::Rust => "billing",
            Language::Python => "billing_py",
            Language::JavaScript => "billing_js",
        }
    }
}

/// A host running one language's billing as the handler `billing`.
async fn billing_env(language: Language, backend: Backend, topic: &str) -> TestEnv {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_url = database_url(backend, dir.path()).await;
    // One compile cache for every test: Python and JavaScript components take
    // seconds to compile (design §7), and entries are keyed by content.
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    let handler = format!(
        r#"
[[handlers]]
name = "billing"
component = "{component}"
migrations = "{migrations}"
topics = ["{topic}"]
group_id = "{group}"
outbox_topics = {{ "invoices.created" = "invoices.created" }}

[handlers.instances]
reuse = true

[handlers.limits]
max_outbox_bytes = 2048

[handlers.retry]
max_attempts = 2
backoff_initial_ms = 10
backoff_max_ms = 20

# Sent messages are kept (not deleted as sent), so the test can count them.
[outbox]
retention = "1d"
"#,
        component = guest_wasm(language.component()).display(),
        migrations = guest_migrations("billing").display(),
        group = unique("group"),
    );
    TestEnv::with_config(dir, db_url, &cache, "billing", topic, &handler)
}

fn order(id: &str, body: serde_json::Value) -> Send {
    Send {
        key: id.to_owned(),
        event_id_header: Some(id.to_owned()),
        payload: body.to_string().into_bytes(),
        traceparent: None,
    }
}

async fn billing_behaves_the_same(language: Language, backend: Backend) {
    let topic = unique("billing-lang");
    create_topic(&topic, 2).await;
    let env = billing_env(language, backend, &topic).await;

    let mut records = orders_with_duplicates(60, 5);
    let (not_json, negative, no_email, huge, untyped) = (new_id(), new_id(), new_id(), new_id(), new_id());
    records.push(Send {
        key: not_json.clone(),
        event_id_header: Some(not_json.clone()),
        payload: b"not json".to_vec(),
        traceparent: None,
    });
    let valid = |email: serde_json::Value, amount: i64| json!({ "order_id": "o-bad", "customer_email": email, "amount_cents": amount });
    records.push(order(&negative, valid(json!("a@example.com"), -5)));
    records.push(order(&no_email, valid(json!("nobody"), 5)));
    // Inserted, then its outbox message breaks limits.max_outbox_bytes: the
    // insert must be rolled back with the rest.
    let long_email = format!("{}@example.com", "x".repeat(3_000));
    records.push(order(
        &huge,
        json!({ "order_id": "o-huge", "customer_email": long_email, "amount_cents": 5 }),
    ));
    // Not a string where one is expected: the typed Rust decode rejects it;
    // the Python and JavaScript handlers meet it as an uncaught TypeError.
    records.push(order(&untyped, valid(json!(5), 5)));

    let ends = produce(&topic, &records).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(180), &mut host)
        .await;
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));

    // Duplicates skipped, and nothing of a failed event stays.
    env.assert_exactly_once("invoices", 60, &ends).await;
    let db = env.db().await;
    let invoices = env.table("invoices").await;
    assert_eq!(
        count(
            &db,
            &format!("SELECT COUNT(*) FROM {invoices} WHERE order_id IN ('o-huge', 'o-bad')")
        )
        .await,
        0,
        "a failed event's insert is rolled back"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM outbox WHERE handler = 'billing'").await,
        60,
        "one invoices.created per applied order, none for failed ones"
    );

    let letters = dead_letters::find(&db, &Filter::default())
        .await
        .expect("dead letters");
    let letter = |id: &str| {
        letters
            .iter()
            .find(|l| l.event_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no dead letter for {id}: {letters:#?}"))
    };
    assert_eq!(letters.len(), 5, "{letters:#?}");
    let rejected = |id: &str, says: &str| {
        let l = letter(id);
        assert_eq!(l.kind, "rejected", "{l:#?}");
        assert!(l.reason.to_lowercase().contains(says), "{says:?} in {l:#?}");
        assert_eq!(l.attempts, 1, "a rejection is never retried: {l:#?}");
    };
    rejected(&not_json, "json");
    rejected(&negative, "must not be negative");
    rejected(&no_email, "not an email address");
    let huge = letter(&huge);
    assert_eq!(
        (huge.kind.as_str(), huge.attempts),
        ("retries-exhausted", 2),
        "{huge:#?}"
    );
    assert!(huge.reason.contains("max_outbox_bytes"), "{huge:#?}");
    let untyped = letter(&untyped);
    match language {
        Language::Rust => rejected(&untyped.event_id.clone().unwrap(), "invalid type"),
        Language::Python => {
            assert_eq!(untyped.kind, "retries-exhausted", "{untyped:#?}");
            for says in ["Traceback (most recent call last)", "TypeError", "app.py"] {
                assert!(untyped.reason.contains(says), "{says:?} in {}", untyped.reason);
            }
        }
        Language::JavaScript => {
            assert_eq!(untyped.kind, "retries-exhausted", "{untyped:#?}");
            for says in ["TypeError", "billing.js"] {
                assert!(untyped.reason.contains(says), "{says:?} in {}", untyped.reason);
            }
        }
    }
}

async fn rust_billing(backend: Backend) {
    billing_behaves_the_same(Language::Rust, backend).await
}
async fn python_billing(backend: Backend) {
    billing_behaves_the_same(Language::Python, backend).await
}
async fn javascript_billing(backend: Backend) {
    billing_behaves_the_same(Language::JavaScript, backend).await
}

crate::on_both_backends!(rust_billing, python_billing, javascript_billing);
