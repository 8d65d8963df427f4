//! The broker cut while the relay is sending (issue 27): billing invoices
//! orders and its relay publishes `invoices.created`, which notifier, on
//! the same host, turns into one email each. Every connection to the broker
//! is cut for ten seconds mid-stream: the relay's sends in flight fail or
//! are retried by the idempotent producer, the consumers lose their group.
//! Whatever the broker got twice, the next inbox applies once: one invoice
//! and one email per order, and the outbox drains.

use super::proxy::{FaultProxy, Mode, Protocol};
use crate::support::*;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A tansu broker of the test's own, which tells its clients to reach it
/// through a fault proxy (its advertised listener), so the proxy carries
/// every connection, not just the bootstrap one. Stopped on drop.
struct BrokerBehindProxy {
    child: Child,
    proxy: FaultProxy,
}

impl BrokerBehindProxy {
    async fn start() -> Self {
        let bin = std::env::var("INBOXD_TEST_TANSU_BIN").expect(
            "INBOXD_TEST_TANSU_BIN is not set: run the suite with scripts/test, which installs tansu",
        );
        let port = free_port();
        let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), Protocol::Raw).await;
        let child = Command::new(bin)
            .arg("broker")
            .args(["--listener-url", &format!("tcp://127.0.0.1:{port}")])
            .args(["--advertised-listener-url", &format!("tcp://{}", proxy.addr())])
            .args(["--storage-engine", "memory://tansu/"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tansu");
        let listening = poll_until(Duration::from_secs(20), || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
        })
        .await;
        assert!(listening, "the test's own tansu never listened on {port}");
        Self { child, proxy }
    }

    fn brokers(&self) -> String {
        self.proxy.addr().to_string()
    }
}

impl Drop for BrokerBehindProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_cut_while_the_relay_sends_applies_each_message_once_downstream() {
    let broker = BrokerBehindProxy::start().await;
    let brokers = broker.brokers();
    let (orders_topic, invoices_topic) = (unique("orders"), unique("invoices"));
    create_topic_on(&brokers, &orders_topic, 3).await;
    create_topic_on(&brokers, &invoices_topic, 3).await;
    let handlers = format!(
        "{}\n[outbox]\nretention = \"1d\"\n",
        chain_handlers(&orders_topic, &invoices_topic)
    );
    let env = TestEnv::with_handlers(Backend::Postgres, "billing", &orders_topic, &handlers).await;
    // The config names the shared broker; this test's host goes through the proxy.
    let config = std::fs::read_to_string(&env.config_path).expect("read the config");
    let config = config.replace(
        &format!("\"{}\"", crate::support::brokers()),
        &format!("\"{brokers}\""),
    );
    std::fs::write(&env.config_path, config).expect("write the config");

    let initial = 4_000;
    let mut ends: HashMap<i32, i64> =
        produce_to(&brokers, &orders_topic, &orders_with_duplicates(initial, 5)).await;
    let mut host = env.spawn_host();
    let db = env.db().await;
    let emails = db.handler_table("notifier", "emails");
    let emails_sent = || {
        let (db, emails) = (db.clone(), emails.clone());
        async move {
            db.query_i64(&format!("SELECT COUNT(*) FROM {emails}"), &[])
                .await
                .unwrap_or(0)
        }
    };
    // The relay is sending when the first emails arrive; orders keep coming.
    let relaying = poll_until(Duration::from_secs(120), || async { emails_sent().await > 0 }).await;
    assert!(relaying, "no email before the cut:\n{}", host.log());
    let trickle = Trickle::start_on(&brokers, &orders_topic);
    // Cut while messages wait for the relay, so its sends are in the way.
    let backlog = poll_until(Duration::from_secs(60), || async {
        inboxd::db::outbox::backlog(&db, "billing")
            .await
            .map_or(0, |(n, _)| n)
            > 0
    })
    .await;
    assert!(backlog, "the relay never had messages waiting:\n{}", host.log());

    broker.proxy.set(Mode::Cut);
    tokio::time::sleep(Duration::from_secs(10)).await;
    broker.proxy.set(Mode::Pass);
    let unique_events = initial + trickle.stop(&mut ends).await;

    env.wait_for_offsets(&ends, Duration::from_secs(180), &mut host)
        .await;
    let settled = poll_until(Duration::from_secs(180), || async {
        let (backlog, _) = inboxd::db::outbox::backlog(&db, "billing")
            .await
            .unwrap_or((1, None));
        backlog == 0 && emails_sent().await >= unique_events as i64
    })
    .await;
    assert!(
        settled,
        "the chain did not settle: {} of {unique_events} emails:\n{}",
        emails_sent().await,
        host.log()
    );
    assert!(host.is_running(), "the host must survive the cut");
    assert_eq!(host.terminate(Duration::from_secs(30)).await, Some(0));

    env.assert_exactly_once("invoices", unique_events, &ends).await;
    // A message the broker got twice has one event id: notifier's inbox
    // applies it once. (Order ids repeat across the trickle's rounds.)
    let twice = format!(
        "SELECT COUNT(*) FROM (SELECT event_id FROM {emails} GROUP BY event_id HAVING COUNT(*) > 1) d"
    );
    assert_eq!(count(&db, &twice).await, 0, "no invoice message emailed twice");
    assert_eq!(emails_sent().await, unique_events as i64, "one email per order");
    let messages = count(&db, "SELECT COUNT(*) FROM outbox WHERE handler = 'billing'").await;
    assert_eq!(messages, unique_events as i64, "one outbox message per invoice");
    let dead = count(&db, "SELECT COUNT(*) FROM dead_letters").await;
    assert_eq!(dead, 0, "no healthy event dead-lettered:\n{}", host.log());
}
