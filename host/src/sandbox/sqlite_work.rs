//! SQLite's per-row work bound (the seventh adversarial read, issue 23).
//!
//! SQLite runs its progress handler, and so looks at the event's deadline,
//! only where the program jumps (the end of a loop, a branch), never inside
//! the straight-line code that computes one row: 2,000 `upper(s)` over a
//! 900 KB value in one SELECT list ran 7 s against a 100 ms deadline. So the
//! guard counts a statement's calls and operators, each at the dearest call's
//! measured cost over a value at `limits.max_row_bytes` (`upper`, 3.9 ms at
//! 917 KB: about 5 ns per byte), and refuses a statement past half a second.
//! Half, because a write also runs its table's CHECK expressions in the
//! same row. SQLite's query flattener, which copied a derived column's
//! expression to every reference (nested, exponentially many calls from a
//! few hundred bytes, and gigabytes of memory while preparing), is turned off
//! on every connection (`authorizer::install`).

use super::guard::Refusal;
use sqlparser::ast::{Expr, Statement, Visit, Visitor};
use std::ops::ControlFlow;

/// Nanoseconds one call or operator may take per byte of its input.
const NS_PER_BYTE: u64 = 5;
/// What one statement's calls may take together, at the row bound.
const BUDGET_NS: u64 = 500_000_000;
/// Calls allowed whatever the row bound.
const MIN_CALLS: u64 = 16;

/// The most calls and operators one statement may hold at this row bound.
pub fn max_calls(row_bytes: usize) -> u64 {
    (BUDGET_NS / NS_PER_BYTE / (row_bytes as u64).max(1)).max(MIN_CALLS)
}

/// Refuses a statement with more calls and operators than [`max_calls`].
pub fn check(statement: &Statement, row_bytes: usize) -> Result<(), Refusal> {
    let mut count = Count(0);
    let _ = statement.visit(&mut count);
    let max = max_calls(row_bytes);
    if count.0 > max {
        return Err(Refusal::Limit(format!(
            "this statement makes {} calls and operators; at limits.max_row_bytes = {row_bytes} at most {max} \
             fit the time SQLite cannot interrupt (it looks at the deadline only between rows): split the \
             statement, or lower limits.max_row_bytes",
            count.0
        )));
    }
    Ok(())
}

struct Count(u64);

impl Visitor for Count {
    type Break = ();

    // Every expression but a name or a literal counts: sqlparser has a node
    // of its own for many calls (`TRIM`, `SUBSTRING`, `IN (...)`), and a list
    // of the kinds that are calls missed some (the eighth adversarial read).
    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        if !matches!(
            expr,
            Expr::Identifier(_) | Expr::CompoundIdentifier(_) | Expr::Value(_) | Expr::Nested(_)
        ) {
            self.0 += 1;
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::SQLiteDialect;
    use sqlparser::parser::Parser;

    fn judged(sql: &str, row_bytes: usize) -> Result<(), Refusal> {
        let statements = Parser::parse_sql(&SQLiteDialect {}, sql).unwrap();
        check(&statements[0], row_bytes)
    }

    #[test]
    fn many_calls_over_one_row_are_refused_and_ordinary_statements_are_not() {
        let upper = vec!["length(upper(s))"; 60].join(", ");
        let err = judged(&format!("SELECT {upper} FROM t"), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("limits.max_row_bytes") && err.contains("120 calls"),
            "{err}"
        );
        assert!(
            judged(&format!("SELECT {upper} FROM t"), 64 << 10).is_ok(),
            "smaller rows, more calls"
        );
        assert!(
            judged(
                "INSERT INTO t (a, b) VALUES ($1, lower($2)) ON CONFLICT (a) DO NOTHING",
                1 << 20
            )
            .is_ok()
        );
        assert!(
            judged(
                "SELECT a, b FROM t WHERE a = $1 AND b > $2 ORDER BY a LIMIT 10",
                1 << 20
            )
            .is_ok()
        );
        assert_eq!(max_calls(1 << 20), 95);
        assert_eq!(max_calls(64 << 20), MIN_CALLS);
    }
}
