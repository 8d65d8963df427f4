//! Mode (c): the billing handler as native Rust, compiled into the benchmark.
//!
//! It decodes the same payload, runs the same INSERT through the same
//! transaction calls a guest's `sql.execute` reaches (minus the statement
//! guard), and publishes the same outbox message, so (a) against (c) is the
//! price of the sandbox: Wasm instantiation, the calls across it, the guard.

use futures_util::future::BoxFuture;
use inboxd::capabilities::outbox::stamp_json_id;
use inboxd::db::outbox::NewMessage;
use inboxd::db::{Tx, Walls};
use inboxd::handler::Handler;
use inboxd::handler::{GuestFailure, Invocation};
use inboxd::record::Record;
use inboxd::sandbox::postgres::PlainInsert;
use serde::Deserialize;
use std::sync::{Arc, OnceLock};

const INSERT: &str =
    "INSERT INTO invoices (order_id, customer_email, amount_cents, event_id) VALUES ($1, $2, $3, $4)";

/// What the guard's verdict on [`INSERT`] says of it on PostgreSQL: a plain
/// one-row INSERT, which the host holds back and sends with the batch's others.
fn plain_insert() -> Option<&'static Arc<PlainInsert>> {
    static PLAIN: OnceLock<Option<Arc<PlainInsert>>> = OnceLock::new();
    PLAIN
        .get_or_init(|| PlainInsert::of(INSERT).map(Arc::new))
        .as_ref()
}

#[derive(Deserialize)]
struct OrderConfirmed {
    order_id: String,
    customer_email: String,
    amount_cents: i64,
}

pub struct NativeBilling {
    /// The real topic `invoices.created` maps to.
    pub invoices_topic: String,
    pub max_payload_bytes: usize,
    /// The same walls a component gets: billing's own table, its time limit.
    pub walls: Walls,
    /// How long each event waits inside its transaction before its insert,
    /// as a handler whose query waits on a busy database would (0: none).
    pub delay: std::time::Duration,
}

impl Handler for NativeBilling {
    fn name(&self) -> &str {
        "billing"
    }

    fn version_label(&self) -> &str {
        "native"
    }

    fn max_payload_bytes(&self) -> usize {
        self.max_payload_bytes
    }

    fn walls(&self) -> &Walls {
        &self.walls
    }

    fn timeout(&self) -> std::time::Duration {
        self.walls.statement_timeout()
    }

    fn invoke<'a>(
        &'a self,
        mut tx: Tx,
        record: &'a Record,
        event_id: &'a str,
        _attempt: u32,
        _budget: std::time::Duration,
    ) -> BoxFuture<'a, Invocation> {
        Box::pin(async move {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            let order: OrderConfirmed = match serde_json::from_slice(&record.payload) {
                Ok(order) => order,
                Err(e) => {
                    return done(
                        tx,
                        Err(GuestFailure::Reject(format!("not an order: {e}"))),
                        vec![],
                    );
                }
            };
            let params = [
                order.order_id.as_str().into(),
                order.customer_email.as_str().into(),
                order.amount_cents.into(),
                event_id.into(),
            ];
            let insert = (tx.backend() == inboxd::config::Backend::Postgres)
                .then(plain_insert)
                .flatten();
            let inserted = tx.guest_execute_approved(INSERT, &params, insert, true).await;
            if let Err(error) = inserted {
                return done(tx, Err(GuestFailure::Retry(error.to_string())), vec![]);
            }
            let created = serde_json::json!({
                "order_id": order.order_id,
                "customer_email": order.customer_email,
                "amount_cents": order.amount_cents,
                "order_event_id": event_id,
            });
            // The host's id goes into the JSON too, as `outbox.publish` does.
            let id = uuid::Uuid::now_v7().to_string();
            let payload = match stamp_json_id(&self.invoices_topic, created.to_string().into_bytes(), &id) {
                Ok(payload) => payload,
                Err(error) => return done(tx, Err(GuestFailure::Retry(error)), vec![]),
            };
            let message = NewMessage {
                id,
                topic: self.invoices_topic.clone(),
                key: Some(order.order_id.into_bytes()),
                payload,
                headers: vec![],
            };
            done(tx, Ok(()), vec![message])
        })
    }
}

fn done(tx: Tx, result: Result<(), GuestFailure>, outbox: Vec<NewMessage>) -> Invocation {
    Invocation {
        tx: Some(tx),
        result,
        host_error: None,
        outbox,
    }
}
