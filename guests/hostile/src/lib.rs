//! A deliberately misbehaving handler for the host's tests.
//!
//! The payload's `attack` field picks what it does, so one component covers
//! every attack and each test reads as data: `{"attack": "loop"}`.
//! - `ok`: insert one `hostile_effects` row (the well-behaved control case)
//! - `loop`: spin forever (the time limit must stop it)
//! - `memory`: allocate without bound (the memory limit must stop it)
//! - `panic`: trap with a message on stderr
//! - `stdout`: write `bytes` bytes to stdout, then succeed
//! - `sql`: run `statement` and reject with the error text if it is refused
//! - `retry` / `reject`: return that handler error

wit_bindgen::generate!({ world: "handler", path: "../../wit" });

use inboxd::handler::sql::{self, Value};
use std::io::Write;

struct Hostile;

fn field<'a>(payload: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    payload.get(name)
}

impl Guest for Hostile {
    fn handle(event: Event) -> Result<(), HandlerError> {
        let payload: serde_json::Value = serde_json::from_slice(&event.payload)
            .map_err(|e| HandlerError::Reject(format!("payload is not JSON: {e}")))?;
        let attack = field(&payload, "attack").and_then(|a| a.as_str()).unwrap_or("ok");
        match attack {
            "ok" => {
                sql::execute(
                    "INSERT INTO hostile_effects (event_id) VALUES ($1)",
                    &[Value::Text(event.id)],
                )
                .map_err(|e| HandlerError::Retry(format!("{e:?}")))?;
                Ok(())
            }
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "memory" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "panic" => panic!("hostile guest panicked on purpose"),
            "stdout" => {
                let bytes = field(&payload, "bytes").and_then(|b| b.as_u64()).unwrap_or(1 << 20);
                let chunk = vec![b'x'; 4096];
                let mut out = std::io::stdout();
                let mut written = 0u64;
                while written < bytes {
                    // A bounded host may refuse more output; that must not stop the event.
                    if out.write_all(&chunk).is_err() {
                        break;
                    }
                    written += chunk.len() as u64;
                }
                Ok(())
            }
            "sql" => {
                let statement = field(&payload, "statement").and_then(|s| s.as_str()).unwrap_or("");
                sql::execute(statement, &[])
                    .map(|_| ())
                    .map_err(|e| HandlerError::Reject(format!("{e:?}")))
            }
            "retry" => Err(HandlerError::Retry("asked to retry".into())),
            "reject" => Err(HandlerError::Reject("asked to reject".into())),
            other => Err(HandlerError::Reject(format!("unknown attack {other:?}"))),
        }
    }
}

export!(Hostile);
