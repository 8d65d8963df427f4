//! The operator console in a real browser (headless Chromium over WebDriver).
//!
//! A team signs in with its token, sees its handler's applied count and
//! parked dead letters arrive live, filters the dead letters by kind, replays
//! one from the page, and the database shows it applied exactly once. A
//! replay that fails again shows its reason; the two that failed for one
//! cause are one group, discarded together. A token scoped to another
//! handler sees neither the handler nor its dead letters, and the API's
//! 401/403 messages appear on the page. The run also takes the overview
//! screenshot docs/operating.md shows (`INBOXD_SCREENSHOT=<path>` keeps it).

use super::*;
use crate::browser::Browser;
use fantoccini::Locator;
use serde_json::json;

/// The largest payload version 1 accepts: the big order below is parked.
const SMALL_PAYLOAD: usize = 400;

fn order(event_id: &str, order_id: &str, amount_cents: i64, note: &str) -> Send {
    let payload = json!({
        "event_id": event_id,
        "order_id": order_id,
        "customer_email": "buyer@example.com",
        "amount_cents": amount_cents,
        "note": note,
    });
    Send {
        key: order_id.to_owned(),
        event_id_header: Some(event_id.to_owned()),
        payload: payload.to_string().into_bytes(),
        traceparent: None,
    }
}

async fn sign_in(browser: &Browser, token: &str) {
    browser.type_into("#token", token).await;
    browser.click("form.login button[type=submit]").await;
}

/// Signs in with the keyboard alone: the token, then Enter.
async fn sign_in_with_keys(browser: &Browser, token: &str) {
    browser.type_into("#token", &format!("{token}\u{E007}")).await;
}

/// Confirms the open confirmation dialog.
async fn confirm(browser: &Browser) {
    browser.click("dialog[open] #confirm-ok").await;
}

#[tokio::test]
async fn a_team_watches_its_handler_and_replays_a_dead_letter_from_the_console() {
    let topic = unique("console");
    create_topic(&topic, 2).await;
    let mut admin = start(Backend::Sqlite, &topic, "").await;
    let db = admin.env.db().await;
    let billing = std::fs::read(guest_wasm("billing")).expect("billing.wasm");
    let group = team_group("billing");
    let settings = |max_payload_bytes: usize| {
        json!({
            "topics": [topic],
            "group_id": group,
            "outbox_topics": billing_outbox(),
            "limits": { "max_payload_bytes": max_payload_bytes },
        })
    };
    let (status, body) = admin
        .upload(
            "billing",
            billing.clone(),
            settings(SMALL_PAYLOAD),
            Some(&guest_migrations("billing")),
            BILLING_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");

    // The page is served with a policy that allows nothing but this host.
    let page = admin
        .http
        .get(format!("{}/", admin.url))
        .send()
        .await
        .expect("GET /");
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        policy.contains("default-src 'none'") && policy.contains("script-src 'self'"),
        "{policy}"
    );

    // Two orders the handler rejects (a negative amount) and one too large for version 1.
    let mut records = vec![
        order(&new_id(), "refund-1", -500, ""),
        order(&new_id(), "refund-2", -700, ""),
    ];
    let big_id = new_id();
    // Its note carries markup: the page must show it as text, never run it.
    let note = format!(
        "<img src=x onerror=\"window.pwned = 1\"> {}",
        "gift wrap ".repeat(60)
    );
    records.push(order(&big_id, "big-order", 9900, &note));
    let mut ends = produce(&topic, &records).await;

    let browser = Browser::start().await;
    browser
        .client
        .goto(&format!("{}/", admin.url))
        .await
        .expect("open the console");

    // A wrong token: the API's 401 is on the page, and the form stays.
    sign_in(&browser, "not-a-token").await;
    browser
        .wait_text("#error", "the 401", |t| {
            t.contains("401") && t.contains("unknown token")
        })
        .await;

    // The team's token: its handler, live. Orders arrive in four waves (10
    // orders and 3 re-sent copies each) while the page stays open: each
    // wave's count appears without a reload.
    sign_in_with_keys(&browser, BILLING_TOKEN).await;
    let card = r#"[data-handler="billing"]"#;
    browser
        .wait_text(
            &format!("{card} [data-field=dead-letters]"),
            "3 dead letters",
            |t| t == "3",
        )
        .await;
    for wave in 1..=4 {
        merge_ends(&mut ends, produce(&topic, &orders_with_duplicates(10, 4)).await);
        let applied = (10 * wave).to_string();
        browser
            .wait_text(
                &format!("{card} [data-field=applied-total]"),
                "the applied count",
                |t| t == applied,
            )
            .await;
    }
    browser
        .wait_text(
            &format!("{card} [data-field=duplicates-total]"),
            "12 duplicates",
            |t| t == "12",
        )
        .await;
    browser
        .wait_text(&format!("{card} [data-field=state]"), "running", |t| {
            t == "Running"
        })
        .await;
    let host = browser
        .wait_text("[data-field=host]", "the answering host", |t| !t.is_empty())
        .await;
    browser
        .wait_text(&format!("{card} [data-field=hosts]"), "this host", |t| t == host)
        .await;
    // Rates over the last minute and latencies are numbers, not placeholders.
    browser
        .wait_text(&format!("{card} [data-field=applied-rate]"), "a rate", |t| {
            t.ends_with("/s") && t.trim_end_matches("/s").parse::<f64>().is_ok_and(|r| r > 0.0)
        })
        .await;
    for latency in ["batch-latency", "guest-latency"] {
        browser
            .wait_text(&format!("{card} [data-field={latency}]"), latency, |t| {
                t.matches(" ms").count() == 2
            })
            .await;
    }
    browser
        .wait_text(
            &format!("{card} [data-field=outbox-backlog]"),
            "the outbox",
            |t| t == "0",
        )
        .await;
    admin
        .env
        .wait_for_offsets(&ends, Duration::from_secs(120), &mut admin.host)
        .await;
    assert_eq!(count(&db, "SELECT COUNT(*) FROM invoices").await, 40);

    // The chart has a few steps of history before the screenshot is taken.
    let chart = format!("{card} polyline.s-applied");
    let started = std::time::Instant::now();
    loop {
        let points = match browser.client.find(Locator::Css(&chart)).await {
            Ok(line) => line.attr("points").await.ok().flatten().unwrap_or_default(),
            Err(_) => String::new(),
        };
        let steps = points.split_whitespace().count();
        if steps >= 4 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the chart never drew 4 steps (it drew {steps})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let png = browser.client.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    if let Ok(path) = std::env::var("INBOXD_SCREENSHOT") {
        // Relative to the repository, wherever cargo runs the test from.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
        std::fs::write(&path, &png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    // On a phone's width the page reflows instead of scrolling sideways.
    browser
        .client
        .set_window_size(390, 844)
        .await
        .expect("phone size");
    let overflow = browser
        .client
        .execute(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
            vec![],
        )
        .await
        .expect("measure");
    assert_eq!(overflow.as_i64(), Some(0), "the overview is wider than a phone");
    browser
        .client
        .set_window_size(1280, 800)
        .await
        .expect("desktop size");

    // Dead letters of billing, filtered by kind: the big order alone.
    browser
        .click(&format!("{card} [data-field=dead-letters] a"))
        .await;
    browser.wait_count("tr[data-dead-letter]", 3).await;
    browser
        .client
        .find(Locator::Css("select[name=kind]"))
        .await
        .expect("kind filter")
        .select_by_value("limit")
        .await
        .expect("choose limit");
    browser.click("form.filters button[type=submit]").await;
    browser.wait_count("tr[data-dead-letter]", 1).await;
    assert_eq!(
        browser
            .text("tr[data-dead-letter] td:nth-child(6)")
            .await
            .as_deref(),
        Some("limit")
    );

    // Its detail: the payload as text (the markup inert), then as hex.
    browser.click("tr[data-dead-letter] td:nth-child(2) a").await;
    browser
        .wait_text("[data-field=event-id]", "the big order's id", |t| t == big_id)
        .await;
    browser
        .wait_text("[data-field=payload]", "the payload as text", |t| {
            t.contains("<img src=x onerror=")
        })
        .await;
    let pwned = browser
        .client
        .execute(
            "return window.pwned === undefined && document.querySelectorAll('main img').length === 0;",
            vec![],
        )
        .await
        .expect("check for injected markup");
    assert_eq!(
        pwned,
        serde_json::Value::Bool(true),
        "the payload's markup ran or rendered"
    );
    browser.click("input[name=payload-mode][value=hex]").await;
    browser
        .wait_text("[data-field=payload]", "the payload in hex", |t| {
            t.starts_with("7b 22")
        })
        .await;

    // Version 2 takes larger payloads; replaying from the page applies it once.
    let (status, body) = admin
        .upload(
            "billing",
            rebuilt(&billing, "v2"),
            settings(4096),
            Some(&guest_migrations("billing")),
            BILLING_TOKEN,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    browser.click("main .actions button.primary").await;
    confirm(&browser).await;
    browser
        .wait_text("#notice", "the replay's outcome", |t| t.contains("replayed"))
        .await;
    browser
        .wait_text("[data-field=resolution]", "the resolution", |t| {
            t.starts_with("replayed")
        })
        .await;
    let applied = count(
        &db,
        &format!("SELECT COUNT(*) FROM inbox WHERE handler = 'billing' AND event_id = '{big_id}' AND status = 'done'"),
    )
    .await;
    assert_eq!(applied, 1, "the replayed event is applied once");
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM invoices WHERE order_id = 'big-order'").await,
        1
    );
    assert_eq!(
        browser.count("main .actions button").await,
        0,
        "a resolved dead letter has no actions"
    );

    // Replaying the two rejected ones (selected in the list) fails again, and says why.
    browser
        .route("#/dead-letters?handler=billing&kind=rejected")
        .await;
    browser
        .wait_for("tr[data-dead-letter] input[type=checkbox]")
        .await;
    for checkbox in browser
        .client
        .find_all(Locator::Css("tr[data-dead-letter] input[type=checkbox]"))
        .await
        .expect("checkboxes")
    {
        checkbox.click().await.expect("select");
    }
    browser.click("main .actions button.primary").await;
    confirm(&browser).await;
    // A replay that fails again is an error, not a success: it is in the banner.
    let said = browser
        .wait_text("#error", "both outcomes", |t| t.matches(": failed").count() == 2)
        .await;
    assert!(said.contains("amount_cents must not be negative"), "{said}");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM dead_letters WHERE handler = 'billing' AND resolution IS NULL"
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM invoices WHERE order_id LIKE 'refund-%'"
        )
        .await,
        0
    );

    // The two refunds are one group (their reasons differ in numbers only).
    // Through the API: the team sees it; another team's token neither sees
    // it nor can act on it (404, as for one dead letter of another team).
    let groups_url = format!("{}/v1/dead-letters/groups", admin.url);
    let (status, groups) = admin.call(admin.http.get(&groups_url), Some(BILLING_TOKEN)).await;
    assert_eq!(status, 200, "{groups}");
    assert_eq!(groups.as_array().map(Vec::len), Some(1), "{groups}");
    assert_eq!(groups[0]["count"], 2);
    assert_eq!(groups[0]["members"].as_array().map(Vec::len), Some(2));
    let group_id = groups[0]["id"].as_str().expect("group id").to_owned();
    let (status, theirs) = admin.call(admin.http.get(&groups_url), Some(NOTIFY_TOKEN)).await;
    assert_eq!((status, theirs), (200, json!([])));
    for action in ["replay", "discard"] {
        let url = format!("{groups_url}/{group_id}/{action}");
        let (status, body) = admin.call(admin.http.post(&url), Some(NOTIFY_TOKEN)).await;
        assert_eq!(status, 404, "{action}: {body}");
        assert!(!body.to_string().contains("billing"), "{body}");
    }

    // On the page the group is shown above the list; discarding the group
    // resolves both, each reported.
    browser.route("#/dead-letters?handler=billing").await;
    browser.wait_count("tr[data-group]", 1).await;
    assert_eq!(
        browser.text("tr[data-group] [data-field=count]").await.as_deref(),
        Some("2")
    );
    browser.click("tr[data-group] [data-action=discard-group]").await;
    confirm(&browser).await;
    let said = browser
        .wait_text("#notice", "the group's outcome", |t| t.contains("2 discarded"))
        .await;
    browser.wait_for("[data-field=no-dead-letters]").await;
    assert_eq!(browser.count("tr[data-group]").await, 0, "no group is left");
    let discarded = rows(
        &db,
        "SELECT id FROM dead_letters WHERE handler = 'billing' AND resolution = 'discarded' ORDER BY id",
    )
    .await;
    assert_eq!(discarded.len(), 2);
    for id in &discarded {
        let id = id[0].as_i64().expect("id").to_string();
        assert!(said.contains(&id), "member {id} is not reported: {said}");
    }
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM invoices WHERE order_id LIKE 'refund-%'"
        )
        .await,
        0
    );
    let letter = rows(&db, "SELECT id FROM dead_letters ORDER BY id LIMIT 1").await[0][0]
        .as_i64()
        .expect("id");

    // Another team's token sees neither the handler nor its dead letters.
    browser.click("#session button").await;
    sign_in(&browser, NOTIFY_TOKEN).await;
    browser.wait_for("[data-field=no-handlers]").await;
    assert_eq!(browser.count(card).await, 0);
    browser.route("#/dead-letters").await;
    browser.wait_for("[data-field=no-dead-letters]").await;
    assert_eq!(browser.count("tr[data-dead-letter]").await, 0);
    assert_eq!(browser.count("tr[data-group]").await, 0);
    browser.route("#/handlers/billing").await;
    browser
        .wait_text("#error", "the 403", |t| {
            t.contains("403") && t.contains("may not manage handler")
        })
        .await;
    // Another team's dead letter is "not found", as if it did not exist.
    browser.route(&format!("#/dead-letters/{letter}")).await;
    let said = browser
        .wait_text("#error", "the 404", |t| t.contains("404"))
        .await;
    assert!(!said.contains("billing"), "{said}");
    assert_eq!(browser.count("[data-field=payload]").await, 0, "no payload shown");
    browser.close().await;
}
