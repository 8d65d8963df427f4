//! `inboxd:handler/outbox`: not available yet in this host version.
//!
//! Publishing refuses with a clear error rather than pretending to succeed, so
//! a handler that relies on it fails visibly (and retries or dead-letters)
//! instead of losing messages.

use crate::wasm::bindings::{Message, outbox_api};
use wasmtime::component::HasData;

pub struct OutboxCap;

impl HasData for OutboxCap {
    type Data<'a> = OutboxView;
}

pub struct OutboxView;

impl outbox_api::Host for OutboxView {
    fn publish(&mut self, message: Message) -> Result<String, String> {
        Err(format!(
            "outbox.publish is not supported by this inboxd version yet (message to topic {:?} not sent)",
            message.topic
        ))
    }
}
