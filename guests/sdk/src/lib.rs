//! Write an [Inboxd](https://github.com/) handler in Rust.
//!
//! A handler is one function from an [`Event`] to a [`Result`], exported with
//! [`export_handler!`]. Everything it writes with [`sql`] and publishes with
//! [`outbox`] commits in the host's transaction, together with the host's
//! claim on the event id: a redelivered event never reaches the handler again.
//!
//! ```ignore
//! use inboxd_guest::{Event, Result, ensure, outbox, sql};
//!
//! #[derive(serde::Deserialize)]
//! struct Order { order_id: String, amount_cents: i64 }
//!
//! fn handle(event: Event) -> Result {
//!     let order: Order = event.json()?; // a bad payload is rejected (dead-lettered)
//!     ensure!(order.amount_cents >= 0, "amount_cents must not be negative");
//!     sql::execute("INSERT INTO invoices (order_id, amount_cents) VALUES ($1, $2)",
//!                  (&order.order_id, order.amount_cents))?;
//!     outbox::publish_json("invoices.created", &order.order_id, &order.order_id)?;
//!     Ok(())
//! }
//!
//! inboxd_guest::export_handler!(handle);
//! ```
//!
//! Failures: [`Error::Reject`] parks the event at once (it can never
//! succeed); [`Error::Retry`] rolls back and lets the host retry with
//! backoff. A panic is a trap: retried, then dead-lettered with its message.

mod error;
mod event;
pub mod log;
pub mod outbox;
pub mod sql;

pub use error::{Error, Result};
pub use event::Event;

/// The raw bindings of the `inboxd:handler` world, for what this crate does not wrap.
#[allow(clippy::too_many_arguments)] // in the generated code
pub mod bindings {
    wit_bindgen::generate!({
        world: "handler",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "inboxd_guest::bindings",
        additional_derives: [PartialEq],
    });
}

/// Runs a handler function on a raw event; what [`export_handler!`] calls.
#[doc(hidden)]
pub fn run(
    event: bindings::Event,
    handle: fn(Event) -> Result,
) -> core::result::Result<(), bindings::HandlerError> {
    handle(Event::new(event)).map_err(Error::into_wit)
}

/// Exports `fn(Event) -> inboxd_guest::Result` as the component's handler.
#[macro_export]
macro_rules! export_handler {
    ($handle:path) => {
        struct __InboxdHandler;
        impl $crate::bindings::Guest for __InboxdHandler {
            fn handle(
                event: $crate::bindings::Event,
            ) -> ::core::result::Result<(), $crate::bindings::HandlerError> {
                $crate::run(event, $handle)
            }
        }
        $crate::bindings::export!(__InboxdHandler with_types_in $crate::bindings);
    };
}

/// Rejects the event (it is dead-lettered at once) unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($message:tt)+) => {
        if !$cond {
            return ::core::result::Result::Err($crate::Error::Reject(format!($($message)+)));
        }
    };
}
