//! What the statement guard says of statements, without a host: for
//! reviewing the sandbox's walls (an adversarial read writes its candidates
//! here before it measures them on a server).
//!
//! ```text
//! cargo run -p inboxd --example guard_verdicts -- [postgres|sqlite|migration] < statements.sql
//! ```
//!
//! Statements are read from stdin, separated by lines holding only `;;`.
//! Each gets one line: `allowed` or `refused: <the guard's words>`. The
//! handler owns the tables `t`, `u`, `v`, `w`, `x`, `y` and `u0`..`u9`, rows
//! are at most 1 MiB and statements 64 KiB (the defaults). `migration` judges
//! PostgreSQL migration statements (DDL) by the expression rules alone.

use inboxd::config::Backend;
use inboxd::sandbox::guard::{Guard, Refusal};
use inboxd::sandbox::{nesting, postgres};
use std::io::Read;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "postgres".into());
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("stdin");
    let mut tables: Vec<String> = ["t", "u", "v", "w", "x", "y"].map(String::from).to_vec();
    tables.extend((0..10).map(|i| format!("u{i}")));
    let guard = |backend, schema| Guard::new(backend, schema, &tables, 64 << 10, 1 << 20);
    let (postgres_guard, sqlite_guard) = (
        guard(Backend::Postgres, "handler_h"),
        guard(Backend::Sqlite, "main"),
    );
    for (i, sql) in input
        .split("\n;;\n")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .enumerate()
    {
        let verdict = match mode.as_str() {
            "sqlite" => sqlite_guard.check(sql),
            "migration" => nesting::on_guard_stack(|| {
                postgres::check(sql, postgres::Mode::Migration, 1 << 20, &Default::default()).map(drop)
            }),
            _ => postgres_guard.check(sql),
        };
        match verdict {
            Ok(()) => println!("{}: allowed", i + 1),
            Err(Refusal::Forbidden(m) | Refusal::Limit(m)) => println!("{}: refused: {m}", i + 1),
        }
    }
}
