//! Bounds on what the guards build from a handler's SQL, checked before they
//! build it: how deep a syntax tree a statement text can make.
//!
//! A syntax tree is built, walked, printed, compared and dropped by recursion,
//! one stack frame (or several) per level. A statement such as
//! `SELECT 1+1+...+1` parses in a loop into a tree as deep as it has operators,
//! so within the statement-size limit it could overflow any thread's stack when
//! it is dropped, and with it the whole host (issue 23). The parser's own
//! recursion limit does not see such chains, so [`check`] reads the statement's
//! tokens (a flat scan, no tree) and refuses one whose tree *could* be deeper
//! than [`MAX_NESTING`] levels, before any tree exists.
//!
//! The bound is conservative: per parenthesis level, every keyword and operator
//! token since the last list separator (`,`, `WHEN`, `THEN`, `ELSE`) counts as
//! one level, set operations (`UNION`, `INTERSECT`, `EXCEPT`) count across
//! separators, and the levels of the parentheses around a token add up. A tree
//! can only grow a level where one of those tokens stands. Legitimate SQL stays
//! far below it; SQLite itself refuses expressions deeper than 1,000.
//!
//! [`on_guard_stack`] runs the parse, the checks and the drop on a thread whose
//! stack holds a tree of that depth with room to spare, so no guest, migration
//! or upload can reach the stack limit of the thread that asked.

use super::guard::Refusal;
use sqlparser::dialect::Dialect;
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, Tokenizer};

/// The deepest a statement's syntax tree may be (see the module docs).
/// SQLite's own `SQLITE_MAX_EXPR_DEPTH` is 1,000, so no statement deeper than
/// this could run there anyway.
pub const MAX_NESTING: usize = 1000;

/// The stack of the thread that parses, checks and drops a statement. A level
/// of nesting costs well under 4 KiB of stack in every recursive pass over the
/// tree (parse, visit, print, compare, drop: measured by the test below), so
/// this holds a tree [`MAX_NESTING`] deep several times over. Only the pages a
/// parse touches are ever committed.
const GUARD_STACK_BYTES: usize = 64 << 20;

/// Refuses a statement text whose syntax tree could be deeper than [`MAX_NESTING`].
pub fn check(dialect: &dyn Dialect, sql: &str) -> Result<(), Refusal> {
    let tokens = Tokenizer::new(dialect, sql)
        .tokenize()
        .map_err(|e| Refusal::Forbidden(format!("the statement guard cannot read this statement ({e})")))?;
    let depth = depth_bound(&tokens);
    if depth > MAX_NESTING {
        return Err(Refusal::Limit(format!(
            "the statement nests up to {depth} operators or parentheses deep; at most {MAX_NESTING} are allowed \
             (write long lists as IN (...) or with = ANY($1), long chains as several statements)"
        )));
    }
    Ok(())
}

/// An upper bound on the depth of the syntax tree `tokens` can make.
fn depth_bound(tokens: &[Token]) -> usize {
    /// One parenthesis level: tokens since its last separator, set operations.
    #[derive(Default, Clone, Copy)]
    struct Level {
        chain: usize,
        set_ops: usize,
    }
    let mut levels = vec![Level::default()];
    let mut outer = 0usize; // the sum of every enclosing level's count
    let mut deepest = 0usize;
    for token in tokens {
        match token {
            Token::Whitespace(_) | Token::EOF => continue,
            Token::LParen => {
                let here = levels.last().copied().unwrap_or_default();
                outer += here.chain + here.set_ops + 1;
                levels.push(Level::default());
            }
            Token::RParen => {
                if levels.len() > 1 {
                    levels.pop();
                    let here = levels.last().copied().unwrap_or_default();
                    outer = outer.saturating_sub(here.chain + here.set_ops + 1);
                }
                // The closed parenthesis is an operand of what follows.
                if let Some(level) = levels.last_mut() {
                    level.chain += 1;
                }
            }
            Token::Comma | Token::SemiColon => {
                if let Some(level) = levels.last_mut() {
                    level.chain = 0;
                }
            }
            Token::Word(word) => {
                let Some(level) = levels.last_mut() else { continue };
                match word.keyword {
                    Keyword::WHEN | Keyword::THEN | Keyword::ELSE => level.chain = 0,
                    Keyword::UNION | Keyword::INTERSECT | Keyword::EXCEPT | Keyword::MINUS => {
                        level.set_ops += 1
                    }
                    Keyword::NoKeyword => {}
                    _ => level.chain += 1,
                }
            }
            // Literals and parameters are leaves.
            Token::Number(..)
            | Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::TripleSingleQuotedString(_)
            | Token::TripleDoubleQuotedString(_)
            | Token::DollarQuotedString(_)
            | Token::NationalStringLiteral(_)
            | Token::EscapedStringLiteral(_)
            | Token::UnicodeStringLiteral(_)
            | Token::HexStringLiteral(_)
            | Token::SingleQuotedByteStringLiteral(_)
            | Token::DoubleQuotedByteStringLiteral(_)
            | Token::Placeholder(_) => {}
            // Every other token (operators, `.`, `::`, `[`, ...) may add a level.
            _ => {
                if let Some(level) = levels.last_mut() {
                    level.chain += 1;
                }
            }
        }
        let here = levels.last().copied().unwrap_or_default();
        deepest = deepest.max(outer + here.chain + here.set_ops + levels.len());
    }
    deepest
}

/// Runs `work` (a parse and whatever walks or drops its tree) on a thread
/// with a stack sized for [`MAX_NESTING`], and waits for it. A panic in the
/// parser or the checks becomes a refusal instead of taking the host down.
pub fn on_guard_stack<T: Send>(work: impl FnOnce() -> Result<T, Refusal> + Send) -> Result<T, Refusal> {
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("inboxd-guard".into())
            .stack_size(GUARD_STACK_BYTES)
            .spawn_scoped(scope, work);
        match spawned {
            Ok(handle) => handle.join().unwrap_or_else(|_| {
                Err(Refusal::Forbidden(
                    "the statement guard failed on this statement (a defect of the host, logged); \
                     it was not run"
                        .into(),
                ))
            }),
            Err(e) => Err(Refusal::Limit(format!(
                "the statement guard could not start a thread to check this statement: {e}"
            ))),
        }
    })
}

/// Runs a check that may take long (a migration's: a parse and walks of up
/// to a megabyte per statement, [`on_guard_stack`] inside it) on tokio's
/// blocking pool, so the caller's task waits without holding one of the
/// runtime's workers, which every pipeline shares (the forty-eighth read).
pub async fn off_worker<T: Send + 'static>(
    check: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(check).await.unwrap_or_else(|_| {
        Err(Refusal::Forbidden(
            "the statement guard failed on this statement (a defect of the host, logged); it was not run"
                .into(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::{PostgreSqlDialect, SQLiteDialect};
    use sqlparser::parser::Parser;

    fn bound(sql: &str) -> usize {
        let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize().unwrap();
        depth_bound(&tokens)
    }

    #[test]
    fn ordinary_statements_are_far_below_the_bound() {
        assert!(bound("INSERT INTO invoices (order_id, amount_cents) VALUES ($1, $2)") < 20);
        assert!(bound("SELECT a FROM t WHERE a = $1 AND b = $2 ORDER BY a LIMIT 1") < 20);
        let rows = vec!["($1, $2::text, lower($3))"; 5000].join(", ");
        assert!(bound(&format!("INSERT INTO t (a, b, c) VALUES {rows}")) < 20);
        let arms: String = (0..2000).map(|i| format!(" WHEN a = {i} THEN b + {i}")).collect();
        assert!(bound(&format!("SELECT CASE{arms} END FROM t")) < 20);
    }

    #[test]
    fn chains_and_nesting_count_toward_the_bound() {
        let chain = format!("SELECT 1{}", "+1".repeat(3000));
        assert!(bound(&chain) > 3000);
        let nested = format!("SELECT {}1{}", "(".repeat(600), ")".repeat(600));
        assert!(bound(&nested) > 600);
        let unions = vec!["SELECT 1, 2"; 1200].join(" UNION ");
        assert!(bound(&unions) > 1200, "commas must not hide set operations");
        let casts = format!("SELECT $1{}", "::text".repeat(2000));
        assert!(bound(&casts) > 2000);
    }

    /// Regression (issue 23): `SELECT 1+1+...+1` of 64 KiB passed the guard and
    /// dropping its tree overflowed the 2 MiB fiber stack, aborting the host.
    #[test]
    fn a_chain_past_the_bound_is_refused_before_it_is_parsed() {
        for dialect in [&PostgreSqlDialect {} as &dyn Dialect, &SQLiteDialect {}] {
            let chain = format!("SELECT 1{}", "+1".repeat(32 * 1024));
            match check(dialect, &chain) {
                Err(Refusal::Limit(m)) => assert!(m.contains("at most 1000"), "{m}"),
                other => panic!("allowed: {other:?}"),
            }
        }
    }

    /// A tree at the bound fits every recursive pass over it (parse, visit,
    /// print, compare, drop) in 1 MiB of stack: half of a tokio worker's, so
    /// a migration's checked statements may be dropped anywhere in the host.
    #[test]
    fn a_tree_at_the_bound_fits_in_a_megabyte_of_stack() {
        let sql = format!("SELECT 1{} FROM t", "+1".repeat(MAX_NESTING - 10));
        check(&PostgreSqlDialect {}, &sql).unwrap();
        std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || {
                let dialect = PostgreSqlDialect {};
                let parsed = Parser::parse_sql(&dialect, &sql).unwrap();
                let again = Parser::parse_sql(&dialect, &parsed[0].to_string()).unwrap();
                assert_eq!(parsed, again);
                let _ = sqlparser::ast::Visit::visit(&parsed[0], &mut Nothing);
            })
            .unwrap()
            .join()
            .expect("a tree at the bound overflowed 1 MiB of stack");
    }

    /// Even a tree 16x deeper than the bound fits on the guard stack: the
    /// bound, not the stack, is what refuses.
    #[test]
    fn the_guard_stack_has_room_far_past_the_bound() {
        let dialect = SQLiteDialect {};
        let sql = format!("SELECT 1{}", "+1".repeat(16 * MAX_NESTING));
        on_guard_stack(|| {
            let parsed = Parser::parse_sql(&dialect, &sql).unwrap();
            let _ = sqlparser::ast::Visit::visit(&parsed[0], &mut Nothing);
            let _ = parsed[0].to_string();
            drop(parsed);
            Ok(())
        })
        .unwrap();
    }

    struct Nothing;
    impl sqlparser::ast::Visitor for Nothing {
        type Break = ();
    }
}
