//! The invoicing handler: one `invoices` row for each `order-confirmed` event.
//!
//! The host has already claimed the event id when `handle` runs, and the insert
//! below commits in the same transaction as that claim, so a redelivered order
//! is never invoiced twice. Payloads that can never succeed are rejected (the
//! host dead-letters them); nothing here retries.

wit_bindgen::generate!({ world: "handler", path: "../../wit" });

use inboxd::handler::log::{self, Level};
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
                Value::Text(order.customer_email),
                Value::Int64(order.amount_cents),
                Value::Text(event.id),
            ],
        )
        .map_err(|e| HandlerError::Retry(format!("inserting the invoice failed: {e:?}")))?;
        log::log(Level::Debug, &format!("invoiced order {}", order.order_id));
        Ok(())
    }
}

export!(Billing);
