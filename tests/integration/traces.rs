//! Traces over OTLP (issue 27): a host with `[telemetry] otlp_endpoint`
//! exports its spans to an OTLP/HTTP (JSON) receiver this test runs. Orders
//! carry a W3C `traceparent`; each must come back as one trace across the
//! chain: billing's event span a child of the producer's span, notifier's
//! event span a child of billing's (the outbox message carried it), the
//! relay's send linked to billing's, and batch spans with their partition.

use crate::support::*;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The spans an OTLP/HTTP JSON export request holds, flattened.
fn spans_of(request: &Value) -> Vec<Value> {
    let mut spans = Vec::new();
    for resource in request["resourceSpans"].as_array().into_iter().flatten() {
        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
            spans.extend(scope["spans"].as_array().into_iter().flatten().cloned());
        }
    }
    spans
}

/// A span's attribute as text (OTLP JSON has one key per value type).
fn attribute(span: &Value, key: &str) -> Option<String> {
    let value = &span["attributes"].as_array()?.iter().find(|a| a["key"] == key)?["value"];
    value["stringValue"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| value["intValue"].as_str().map(str::to_owned))
        .or_else(|| value["intValue"].as_i64().map(|n| n.to_string()))
}

/// An OTLP/HTTP receiver on loopback that keeps every span it is sent.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                kept.lock().unwrap().extend(spans_of(&request));
                axum::Json(serde_json::json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1/traces"), spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_one_trace_through_billing_the_relay_and_notifier() {
    let (endpoint, spans) = receiver().await;
    let (orders_topic, invoices_topic) = (unique("orders"), unique("invoices"));
    create_topic(&orders_topic, 2).await;
    create_topic(&invoices_topic, 2).await;
    let rest = format!(
        "{}\n[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"inboxd-test\"\n",
        chain_handlers(&orders_topic, &invoices_topic)
    );
    let env = TestEnv::with_handlers(Backend::Sqlite, "billing", &orders_topic, &rest).await;

    // Each order on a trace of its own, as its producer's span left it.
    let orders = 5;
    let parents: Vec<(String, String)> = (0..orders)
        .map(|i| {
            (
                uuid::Uuid::new_v4().simple().to_string(),
                format!("{:016x}", 0xabc0_0000_u64 + i as u64),
            )
        })
        .collect();
    let records: Vec<Send> = parents
        .iter()
        .enumerate()
        .map(|(i, (trace, span))| {
            let mut send = Send::order(&new_id(), &format!("o{i}"));
            send.traceparent = Some(format!("00-{trace}-{span}-01"));
            send
        })
        .collect();
    let ends = produce(&orders_topic, &records).await;
    let mut host = env.spawn_host();
    env.wait_for_offsets(&ends, Duration::from_secs(120), &mut host)
        .await;
    let db = env.db().await;
    let emailed = poll_until(Duration::from_secs(120), || async {
        db.query_i64("SELECT COUNT(*) FROM emails", &[])
            .await
            .unwrap_or(0)
            >= orders as i64
    })
    .await;
    assert!(emailed, "the chain did not finish:\n{}", host.log());
    // Stopping sends the spans still buffered.
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));

    let spans = spans.lock().unwrap().clone();
    assert!(!spans.is_empty(), "the receiver got no span:\n{}", host.log());
    let named = |name: &'static str| spans.iter().filter(move |s| s["name"] == name);
    let committed = named("inboxd.batch").any(|s| {
        attribute(s, "handler").as_deref() == Some("billing")
            && attribute(s, "partition").is_some()
            && attribute(s, "size").is_some()
            && attribute(s, "outcome").as_deref() == Some("committed")
    });
    assert!(committed, "no committed batch span of billing's: {spans:#?}");
    for (trace, producer_span) in &parents {
        // A call may have run more than once (a batch run again): the one
        // that applied is the one whose message went on.
        let applied = |handler: &str| {
            named("inboxd.event")
                .filter(|s| {
                    s["traceId"] == trace.as_str()
                        && attribute(s, "handler").as_deref() == Some(handler)
                        && attribute(s, "outcome").as_deref() == Some("applied")
                })
                .cloned()
                .collect::<Vec<_>>()
        };
        let notifier = applied("notifier");
        let notifier = notifier
            .first()
            .unwrap_or_else(|| panic!("no applied notifier span on trace {trace}: {spans:#?}"));
        let billing = applied("billing")
            .into_iter()
            .find(|s| s["spanId"] == notifier["parentSpanId"])
            .unwrap_or_else(|| {
                panic!("notifier's span is no applied billing span's child on trace {trace}: {spans:#?}")
            });
        assert_eq!(
            billing["parentSpanId"],
            producer_span.as_str(),
            "billing's span is the producer's child"
        );
        assert_eq!(
            attribute(&billing, "sql_statements").as_deref(),
            Some("1"),
            "{billing:#}"
        );
        let publish = named("inboxd.publish")
            .find(|s| {
                s["links"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|l| l["traceId"] == trace.as_str() && l["spanId"] == billing["spanId"])
            })
            .unwrap_or_else(|| panic!("no relay send linked to billing's span on trace {trace}: {spans:#?}"));
        assert_eq!(
            attribute(publish, "outcome").as_deref(),
            Some("published"),
            "{publish:#}"
        );
    }

    // One trace as the receiver got it, for the docs (`--nocapture`).
    let (trace, _) = &parents[0];
    let mut by_id: HashMap<String, &Value> = HashMap::new();
    for span in &spans {
        if span["traceId"] == trace.as_str() || span["links"].to_string().contains(trace.as_str()) {
            by_id.insert(span["spanId"].as_str().unwrap_or_default().to_owned(), span);
        }
    }
    println!("trace {trace}:");
    for span in by_id.values() {
        println!(
            "  {} span={} parent={} handler={} outcome={} links={}",
            span["name"].as_str().unwrap_or_default(),
            span["spanId"].as_str().unwrap_or_default(),
            span["parentSpanId"].as_str().unwrap_or_default(),
            attribute(span, "handler").unwrap_or_default(),
            attribute(span, "outcome").unwrap_or_default(),
            span["links"]
        );
    }
}
