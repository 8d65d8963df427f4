//! The complete loop, inbox -> effect -> outbox -> relay -> next inbox: billing
//! invoices each order and emits `invoices.created`; notifier records one
//! email per invoice with its own inbox. Duplicates come in at the input, and
//! the host dies between the handler's commit and the relay's publish, and
//! again between the publish and its mark. Each order still yields exactly
//! one invoice and one email, on the same trace.

use crate::on_both_backends;
use crate::support::*;
use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

on_both_backends!(each_order_yields_one_invoice_and_one_email_through_crashes);

async fn each_order_yields_one_invoice_and_one_email_through_crashes(backend: Backend) {
    let (orders_topic, invoices_topic) = (unique("orders"), unique("invoices"));
    create_topic(&orders_topic, 3).await;
    create_topic(&invoices_topic, 3).await;
    let handlers = chain_handlers(&orders_topic, &invoices_topic);
    let env = TestEnv::with_handlers(backend, "billing", &orders_topic, &handlers).await;

    let orders = 300;
    let traces: Vec<String> = (0..orders)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect();
    let order = |i: usize, id: &str| {
        let mut send = Send::order(id, &format!("o{i}"));
        send.traceparent = Some(format!("00-{}-00f067aa0ba902b7-01", traces[i]));
        send
    };
    let ids: Vec<String> = (0..orders).map(|_| new_id()).collect();
    let mut records: Vec<Send> = ids.iter().enumerate().map(|(i, id)| order(i, id)).collect();
    records.extend(ids.iter().enumerate().step_by(5).map(|(i, id)| order(i, id)));
    let ends = produce(&orders_topic, &records).await;

    // Dies after committing invoices, before the relay publishes any of them.
    let mut first = env.spawn_host_with(&[("INBOXD_FAILPOINTS", "relay-before-publish")]);
    let status = first
        .exited(Duration::from_secs(120))
        .await
        .expect("the first host never hit its failpoint");
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{}", first.log());
    // Dies after the relay's publish is acknowledged, before it is marked.
    let mut second = env.spawn_host_with(&[("INBOXD_FAILPOINTS", "relay-after-publish")]);
    let status = second
        .exited(Duration::from_secs(120))
        .await
        .expect("the second host never hit its failpoint");
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{}", second.log());

    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(180), &mut host)
        .await;
    let db = env.db().await;
    let emails = db.handler_table("notifier", "emails");
    let settled = poll_until(Duration::from_secs(180), || {
        let (db, emails) = (db.clone(), emails.clone());
        async move {
            let (backlog, _) = inboxd::db::outbox::backlog(&db, "billing")
                .await
                .unwrap_or((1, None));
            let sent = db
                .query_i64(&format!("SELECT COUNT(*) FROM {emails}"), &[])
                .await
                .unwrap_or(0);
            let consumed: i64 = inboxd::db::offsets::load_all(&db, "notifier")
                .await
                .unwrap_or_default()
                .iter()
                .map(|p| p.records_committed)
                .sum();
            // The relay's re-sent copies must have reached notifier too.
            backlog == 0 && sent >= orders as i64 && consumed > orders as i64
        }
    })
    .await;
    assert!(settled, "the chain did not settle:\n{}", host.log());
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));

    env.assert_exactly_once("invoices", orders, &ends).await;
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_inboxd"))
        .args(["status", "--json", "--config"])
        .arg(&env.config_path)
        .output()
        .expect("inboxd status");
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status is JSON");
    assert_eq!(status[0]["handler"], "billing");
    assert_eq!(status[0]["outbox_backlog"], 0, "{status:#}");
    assert!(status[0]["relay_lag_ms"].is_null(), "{status:#}");
    assert!(
        status[1]["records_committed"].as_i64().unwrap() > orders as i64,
        "{status:#}"
    );
    let rows = rows(&db, &format!("SELECT order_id, trace_id FROM {emails}")).await;
    assert_eq!(rows.len(), orders, "one email per invoice, none twice");
    let mut per_order: HashMap<String, usize> = HashMap::new();
    for row in &rows {
        let order_id = row[0].as_str().unwrap().to_owned();
        let i: usize = order_id[1..].parse().unwrap();
        assert_eq!(
            row[1].as_str(),
            Some(traces[i].as_str()),
            "order {order_id} kept its trace"
        );
        *per_order.entry(order_id).or_default() += 1;
    }
    assert_eq!(per_order.len(), orders);
    let notifier_letters = inboxd::db::dead_letters::list(&db, "notifier").await.unwrap();
    assert!(notifier_letters.is_empty(), "{notifier_letters:?}");
}
