//! A deliberately misbehaving handler for the host's tests.
//!
//! The payload's `attack` field picks what it does, so one component covers
//! every attack and each test reads as data: `{"attack": "loop"}`.
//! - `ok`: insert one `hostile_effects` row (the well-behaved control case)
//! - `loop`: spin forever (the time limit must stop it)
//! - `memory`: allocate without bound (the memory limit must stop it)
//! - `panic`: trap with a message on stderr
//! - `stdout`: write `bytes` bytes to stdout, then succeed
//! - `log`: log `message` at info, print it on stdout, then succeed
//! - `sql`: run `statement` and reject with the error text if it is refused
//! - `query`: the same through `sql.query`
//! - `repeat`: run `statement` `times` times, rejecting at the first error
//! - `params`: run `statement` with `count` NULL parameters, rejecting with the error
//! - `bind`: query `statement` with `values` bound (a string is text, a
//!   number an int64 or float64, `{"blob": [bytes]}` a blob, null null)
//! - `big-params`: query `statement` with `count` text values of `bytes`
//!   bytes each (a JSON object's text), rejecting with the error
//! - `recurse`: recurse without end (the stack overflows)
//! - `probe-env` / `probe-fs` / `probe-net`: report what WASI lets it see, as a rejection
//! - `until`: ask to retry until delivery `attempt`, then behave like `ok`
//! - `retry` / `reject`: return that handler error
//! - `publish`: publish `body` (any JSON, sent as its text; a string is sent
//!   as is) to `topic` with `key` and `headers` (`{"name": "value"}`), then
//!   record `published <id>`; a refusal is rejected with the host's error text

wit_bindgen::generate!({ world: "handler", path: "../../wit" });

use inboxd::handler::outbox;
use inboxd::handler::sql::{self, Value};
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};

struct Hostile;

/// Each frame keeps a buffer alive so the optimiser cannot turn this into a loop.
#[allow(unconditional_recursion, reason = "the attack is to overflow the stack")]
fn recurse(depth: u64) -> u64 {
    let frame = std::hint::black_box([depth; 64]);
    recurse(depth + 1) + frame[depth as usize % 64]
}

/// Events this instance has handled (a fresh instance starts at 0).
static EVENTS_SEEN: AtomicU32 = AtomicU32::new(0);

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
                let bytes = field(&payload, "bytes")
                    .and_then(|b| b.as_u64())
                    .unwrap_or(1 << 20);
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
            "log" => {
                let message = field(&payload, "message").and_then(|m| m.as_str()).unwrap_or("");
                inboxd::handler::log::log(inboxd::handler::log::Level::Info, message);
                println!("{message}");
                Ok(())
            }
            "sql" => {
                let statement = field(&payload, "statement")
                    .and_then(|s| s.as_str())
                    .unwrap_or("");
                sql::execute(statement, &[])
                    .map(|_| ())
                    .map_err(|e| HandlerError::Reject(format!("{e:?}")))
            }
            "query" => {
                let statement = field(&payload, "statement")
                    .and_then(|s| s.as_str())
                    .unwrap_or("");
                sql::query(statement, &[])
                    .map(|_| ())
                    .map_err(|e| HandlerError::Reject(format!("{e:?}")))
            }
            "repeat" => {
                let statement = field(&payload, "statement")
                    .and_then(|s| s.as_str())
                    .unwrap_or("");
                let times = field(&payload, "times").and_then(|t| t.as_u64()).unwrap_or(1);
                for _ in 0..times {
                    sql::execute(statement, &[]).map_err(|e| HandlerError::Reject(format!("{e:?}")))?;
                }
                Ok(())
            }
            "params" => {
                let statement = field(&payload, "statement")
                    .and_then(|s| s.as_str())
                    .unwrap_or("");
                let count = field(&payload, "count").and_then(|c| c.as_u64()).unwrap_or(1) as usize;
                sql::execute(statement, &vec![Value::Null; count])
                    .map(|_| ())
                    .map_err(|e| HandlerError::Reject(format!("{e:?}")))
            }
            "bind" => {
                let statement = field(&payload, "statement")
                    .and_then(|s| s.as_str())
                    .unwrap_or("");
                let values: Vec<Value> = field(&payload, "values")
                    .and_then(|v| v.as_array())
                    .into_iter()
                    .flatten()
                    .map(bound_value)
                    .collect();
                sql::query(statement, &values)
                    .map(|_| ())
                    .map_err(|e| HandlerError::Reject(format!("{e:?}")))
            }
            "big-params" => {
                let statement = field(&payload, "statement")
                    .and_then(|s| s.as_str())
                    .unwrap_or("");
                let count = field(&payload, "count").and_then(|c| c.as_u64()).unwrap_or(1) as usize;
                let bytes = field(&payload, "bytes").and_then(|b| b.as_u64()).unwrap_or(1) as usize;
                let mut text = String::with_capacity(bytes);
                text.push_str("{\"a\":\"");
                text.extend(std::iter::repeat_n('x', bytes.saturating_sub(7)));
                text.push_str("\"}");
                sql::query(statement, &vec![Value::Text(text); count])
                    .map(|_| ())
                    .map_err(|e| HandlerError::Reject(format!("{e:?}")))
            }
            "recurse" => Err(HandlerError::Reject(format!("depth {}", recurse(0)))),
            "probe-env" => {
                let vars = std::env::vars().count();
                let args = std::env::args().count();
                Err(HandlerError::Reject(format!("env={vars} args={args}")))
            }
            "probe-fs" => {
                let list = std::fs::read_dir("/").map(|_| "ok").unwrap_or("err");
                let read = std::fs::read_to_string("/etc/passwd")
                    .map(|_| "ok")
                    .unwrap_or("err");
                let create = std::fs::write("/tmp/inboxd-hostile", b"x")
                    .map(|_| "ok")
                    .unwrap_or("err");
                Err(HandlerError::Reject(format!(
                    "fs list={list} read={read} create={create}"
                )))
            }
            "probe-net" => {
                let target = field(&payload, "address")
                    .and_then(|a| a.as_str())
                    .unwrap_or("127.0.0.1:5432");
                let connect = std::net::TcpStream::connect(target)
                    .map(|_| "ok")
                    .unwrap_or("err");
                Err(HandlerError::Reject(format!("net connect={connect}")))
            }
            "until" => {
                let needed = field(&payload, "attempt").and_then(|a| a.as_u64()).unwrap_or(1);
                if u64::from(event.attempt) < needed {
                    return Err(HandlerError::Retry(format!(
                        "attempt {} of {needed}",
                        event.attempt
                    )));
                }
                sql::execute(
                    "INSERT INTO hostile_effects (event_id) VALUES ($1)",
                    &[Value::Text(event.id)],
                )
                .map_err(|e| HandlerError::Retry(format!("{e:?}")))?;
                Ok(())
            }
            "recover" => {
                // Not an attack: a statement that fails on every backend, handled,
                // then the real write. On PostgreSQL a failed statement aborts the
                // transaction unless the host contained it.
                if sql::execute("INSERT INTO hostile_effects (event_id) VALUES (NULL)", &[]).is_ok() {
                    return Err(HandlerError::Reject("the NULL insert should have failed".into()));
                }
                sql::execute(
                    "INSERT INTO hostile_effects (event_id) VALUES ($1)",
                    &[Value::Text(event.id)],
                )
                .map_err(|e| HandlerError::Retry(format!("after a handled error: {e:?}")))?;
                Ok(())
            }
            "count" | "grow" => {
                // Not attacks: how many events this instance has handled, so
                // tests can see when the host reuses an instance and when not.
                if attack == "grow" {
                    let mib = field(&payload, "mib").and_then(|m| m.as_u64()).unwrap_or(1) as usize;
                    std::hint::black_box(Box::leak(vec![1u8; mib << 20].into_boxed_slice()));
                }
                let seen = EVENTS_SEEN.fetch_add(1, Ordering::Relaxed) + 1;
                sql::execute(
                    "INSERT INTO hostile_effects (event_id) VALUES ($1)",
                    &[Value::Text(format!("{} {seen}", event.id))],
                )
                .map_err(|e| HandlerError::Retry(format!("{e:?}")))?;
                Ok(())
            }
            "publish" => {
                let text = |name: &str| field(&payload, name).and_then(|v| v.as_str()).map(str::to_owned);
                let body = match field(&payload, "body") {
                    Some(serde_json::Value::String(raw)) => raw.clone().into_bytes(),
                    Some(json) => json.to_string().into_bytes(),
                    None => Vec::new(),
                };
                let headers = field(&payload, "headers")
                    .and_then(|h| h.as_object())
                    .map(|h| {
                        h.iter()
                            .map(|(name, v)| {
                                (name.clone(), v.as_str().unwrap_or_default().as_bytes().to_vec())
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let id = outbox::publish(&outbox::Message {
                    topic: text("topic").unwrap_or_default(),
                    key: text("key").map(String::into_bytes),
                    payload: body,
                    headers,
                })
                .map_err(HandlerError::Reject)?;
                sql::execute(
                    "INSERT INTO hostile_effects (event_id) VALUES ($1)",
                    &[Value::Text(format!("published {id}"))],
                )
                .map_err(|e| HandlerError::Retry(format!("{e:?}")))?;
                Ok(())
            }
            "retry" => Err(HandlerError::Retry("asked to retry".into())),
            "reject" => Err(HandlerError::Reject("asked to reject".into())),
            other => Err(HandlerError::Reject(format!("unknown attack {other:?}"))),
        }
    }
}

export!(Hostile);

/// A `bind` attack's value: a string is text, a number an int64 or float64,
/// `{"blob": [bytes]}` a blob, null null.
fn bound_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::String(s) => Value::Text(s.clone()),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int64(i),
            None => Value::Float64(n.as_f64().unwrap_or_default()),
        },
        serde_json::Value::Object(o) => Value::Blob(
            o.get("blob")
                .and_then(|b| b.as_array())
                .into_iter()
                .flatten()
                .map(|b| b.as_u64().unwrap_or_default() as u8)
                .collect(),
        ),
        _ => Value::Null,
    }
}
