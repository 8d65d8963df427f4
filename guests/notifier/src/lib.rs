//! The email handler: one `emails` row for each `invoices.created` message.
//!
//! It is the second step of a chain: billing's outbox relays its messages at
//! least once, so a message may arrive twice; this handler's own inbox (the
//! host's claim on the message's event id) makes the email go out once. The
//! row stands in for the mail call, which a real handler would make through
//! its own outbox to a mail-sending service.

wit_bindgen::generate!({ world: "handler", path: "../../wit" });

use inboxd::handler::sql::{self, Value};
use serde::Deserialize;

#[derive(Deserialize)]
struct InvoiceCreated {
    order_id: String,
    customer_email: String,
}

struct Notifier;

/// The trace id of a W3C `traceparent` header, if the message has one.
fn trace_id(event: &Event) -> Option<String> {
    let (_, value) = event.headers.iter().find(|(name, _)| name == "traceparent")?;
    let text = std::str::from_utf8(value).ok()?;
    text.split('-').nth(1).map(str::to_owned)
}

impl Guest for Notifier {
    fn handle(event: Event) -> Result<(), HandlerError> {
        let invoice: InvoiceCreated = serde_json::from_slice(&event.payload)
            .map_err(|e| HandlerError::Reject(format!("not an invoices.created message: {e}")))?;
        let trace = trace_id(&event).map_or(Value::Null, Value::Text);
        sql::execute(
            "INSERT INTO emails (event_id, order_id, customer_email, trace_id) VALUES ($1, $2, $3, $4)",
            &[
                Value::Text(event.id),
                Value::Text(invoice.order_id),
                Value::Text(invoice.customer_email),
                trace,
            ],
        )
        .map_err(|e| HandlerError::Retry(format!("recording the email failed: {e:?}")))?;
        Ok(())
    }
}

export!(Notifier);
