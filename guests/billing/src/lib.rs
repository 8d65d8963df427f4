//! The invoicing handler: one `invoices` row for each `order-confirmed` event,
//! and one `invoices.created` message for whoever sends the email. Written
//! with the `inboxd-guest` SDK.
//!
//! The host has already claimed the event id when `handle` runs, and the insert
//! and the outbox message below commit in the same transaction as that claim,
//! so a redelivered order is never invoiced (or announced) twice. Payloads that
//! can never succeed are rejected (the host dead-letters them).

use inboxd_guest::{Event, Result, debug, ensure, outbox, sql};
use serde::Deserialize;

/// The `order-confirmed` payload. Unknown fields are ignored so producers can add to it.
#[derive(Deserialize)]
struct OrderConfirmed {
    order_id: String,
    customer_email: String,
    amount_cents: i64,
}

fn handle(event: Event) -> Result {
    let order: OrderConfirmed = event.json()?;
    ensure!(
        order.amount_cents >= 0,
        "amount_cents must not be negative, got {}",
        order.amount_cents
    );
    ensure!(
        order.customer_email.contains('@'),
        "customer_email {:?} is not an email address",
        order.customer_email
    );
    sql::execute(
        "INSERT INTO invoices (order_id, customer_email, amount_cents, event_id) VALUES ($1, $2, $3, $4)",
        (
            &order.order_id,
            &order.customer_email,
            order.amount_cents,
            event.id(),
        ),
    )?;
    let created = serde_json::json!({
        "order_id": order.order_id,
        "customer_email": order.customer_email,
        "amount_cents": order.amount_cents,
        "order_event_id": event.id(),
    });
    outbox::publish_json("invoices.created", &order.order_id, &created)?;
    debug!("invoiced order {}", order.order_id);
    Ok(())
}

inboxd_guest::export_handler!(handle);
