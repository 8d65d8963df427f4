//! {{name}}: one `{{name}}_orders` row and one `orders.recorded` message per order
//! event. Written with the `inboxd-guest` SDK (in `sdk/rust`).
//!
//! The host has already claimed the event id when `handle` runs, and the
//! insert and the message below commit in the same transaction as that claim:
//! a redelivered event never reaches `handle` again.

use inboxd_guest::{Event, Result, debug, ensure, outbox, sql};
use serde::Deserialize;

/// The payload. Unknown fields are ignored, so producers can add to it.
#[derive(Deserialize)]
struct Order {
    order_id: String,
    amount_cents: i64,
}

fn handle(event: Event) -> Result {
    // A payload that is not an Order is rejected: parked at once, not retried.
    let order: Order = event.json()?;
    ensure!(
        order.amount_cents >= 0,
        "amount_cents must not be negative, got {}",
        order.amount_cents
    );
    sql::execute(
        "INSERT INTO {{name}}_orders (order_id, amount_cents, event_id) VALUES ($1, $2, $3)",
        (&order.order_id, order.amount_cents, event.id()),
    )?;
    let recorded = serde_json::json!({
        "order_id": order.order_id,
        "amount_cents": order.amount_cents,
    });
    outbox::publish_json("orders.recorded", &order.order_id, &recorded)?;
    debug!("recorded order {}", order.order_id);
    Ok(())
}

inboxd_guest::export_handler!(handle);
