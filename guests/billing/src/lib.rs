//! The invoicing handler: one `invoices` row for each `order-confirmed` event,
//! and one `invoices.created` message for whoever sends the email.
//!
//! The host has already claimed the event id when `handle` runs, and the insert
//! and the outbox message below commit in the same transaction as that claim,
//! so a redelivered order is never invoiced (or announced) twice. Payloads that
//! can never succeed are rejected (the host dead-letters them).

wit_bindgen::generate!({ world: "handler", path: "../../wit" });

use inboxd::handler::log::{self, Level};
use inboxd::handler::outbox::{self, Message};
use inboxd::handler::sql::{self, Value};
use serde::Deserialize;

/// The `order-confirmed` payload. Unknown fields are ignored so producers can add to it.
#[derive(Deserialize)]
struct OrderConfirmed {
    order_id: String,
    customer_email: String,
    amount_cents: i64,
}

struct Billing;

impl Guest for Billing {
    fn handle(event: Event) -> Result<(), HandlerError> {
        let order: OrderConfirmed = serde_json::from_slice(&event.payload)
            .map_err(|e| HandlerError::Reject(format!("not an order-confirmed event: {e}")))?;
        if order.amount_cents < 0 {
            return Err(HandlerError::Reject(format!(
                "amount_cents must not be negative, got {}",
                order.amount_cents
            )));
        }
        if !order.customer_email.contains('@') {
            return Err(HandlerError::Reject(format!(
                "customer_email {:?} is not an email address",
                order.customer_email
            )));
        }
        sql::execute(
            "INSERT INTO invoices (order_id, customer_email, amount_cents, event_id) VALUES ($1, $2, $3, $4)",
            &[
                Value::Text(order.order_id.clone()),
                Value::Text(order.customer_email.clone()),
                Value::Int64(order.amount_cents),
                Value::Text(event.id.clone()),
            ],
        )
        .map_err(|e| HandlerError::Retry(format!("inserting the invoice failed: {e:?}")))?;
        let created = serde_json::json!({
            "order_id": order.order_id,
            "customer_email": order.customer_email,
            "amount_cents": order.amount_cents,
            "order_event_id": event.id,
        });
        outbox::publish(&Message {
            topic: "invoices.created".into(),
            key: Some(order.order_id.clone().into_bytes()),
            payload: created.to_string().into_bytes(),
            headers: vec![],
        })
        .map_err(|e| HandlerError::Retry(format!("publishing invoices.created failed: {e}")))?;
        log::log(Level::Debug, &format!("invoiced order {}", order.order_id));
        Ok(())
    }
}

export!(Billing);
