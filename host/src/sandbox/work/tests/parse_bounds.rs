//! What the guard bounds before PostgreSQL's parse tree is read (the
//! fifty-second read and its reviews, issue 23): a statement's tokens, the
//! copies a multiple assignment makes, and what a padded `char(n)` makes.

use super::*;

/// Regression (the fifty-second read, issue 23): the guard built PostgreSQL's
/// parse tree as JSON, several kilobytes per token, before any bound: a
/// 1 MiB `SELECT 1,1,...` held 4 GB of the host. A text's tokens are now
/// counted first.
#[test]
fn a_statement_of_too_many_tokens_is_refused_before_its_tree_is_built() {
    let ones = vec!["1"; 9_000].join(",");
    refused(&format!("SELECT {ones}"), "tokens, at most 16384");
    match migration(&format!("SELECT {ones}")) {
        Err(Refusal::Limit(m)) => assert!(m.contains("tokens"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Large but within it: read (one of a few at a time in the process).
    let within = vec!["1"; 4_000].join(",");
    allowed(&format!("SELECT {within}"));
}

/// Regression (the review of the fifty-second read, issue 23): PostgreSQL's
/// tree writes the source of `SET (a, b, ...) = source` once per name, so
/// `SET (a, a, ..., a) = (1, ..., 1)` in 10 KB (10,007 tokens) made 344 MB
/// of JSON, within the token bound.
#[test]
fn a_multiple_assignment_is_counted_with_its_copies() {
    let names = vec!["a"; 1_000].join(", ");
    let ones = vec!["1"; 4_000].join(", ");
    let sql = format!("UPDATE t SET ({names}) = ({ones}) WHERE id = $1");
    refused(&sql, "copies");
    let upsert =
        format!("INSERT INTO t (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET ({names}) = ({ones})");
    refused(&upsert, "copies");
    allowed("UPDATE t SET (a, b) = ($1, $2) WHERE id = $3");
    allowed("SELECT 1 FROM t WHERE (a, b) = ($1, $2)");
    // A comment between the list and `=` is no way around it (the second
    // review): the scanner returns comments, the parser skips them.
    refused(
        &format!("UPDATE t SET ({names}) /* */ = ({ones}) WHERE id = $1"),
        "copies",
    );
    refused(
        &format!("UPDATE t SET ({names}) --\n= ({ones}) WHERE id = $1"),
        "copies",
    );
    // Lists nested in each other's sources multiply (the second review:
    // five levels of 12 names in 700 tokens are 12^5 copies, not 5 x 12).
    let twelve = |prefix: &str| {
        (0..12)
            .map(|i| format!("{prefix}{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut source = format!("({})", ["1"; 12].join(", "));
    for level in 0..5 {
        source = format!(
            "(WITH x{level} AS (UPDATE t SET ({}) = {source} RETURNING 1) SELECT 1)",
            twelve("b")
        );
    }
    refused(&format!("UPDATE t SET (a) = {source}"), "copies");
    // Calls and comparisons before `=` copy nothing: not counted.
    let args = vec!["a"; 2_000].join(", ");
    allowed(&format!(
        "SELECT 1 FROM t WHERE coalesce({args}) = $1 AND coalesce({args}) = $2"
    ));
}

/// Regression (the fifty-second read, issue 23): a cast of an empty literal
/// to `char(n)` was charged by the literal's 0 bytes, but PostgreSQL pads it
/// to n characters while planning and keeps the constant in a cached plan:
/// 300 of `CAST('' AS char(10485760))` in 11 KB of SQL held 3 GB for 13 s
/// past a 100 ms timeout. What a cast makes now counts, as work and as a
/// literal of that size in the plan.
/// Its review found the same padding in an array's every element
/// (`'{"",...}'::char(100000)[]`: 600 MB for `EXPLAIN` alone) and in every
/// row of a VALUES list into a `char(100000)` column: `char(n)` is now at
/// most `char(256)`, in casts and columns.
#[test]
fn a_padded_cast_counts_at_the_size_it_makes() {
    let long = "at most char(256)";
    refused("SELECT CAST('' AS char(10485760)) IS NULL", long);
    refused("SELECT count(*) FROM unnest('{\"\",\"\"}'::char(100000)[])", long);
    refused("SELECT ''::bpchar(257)", long);
    match migration("CREATE TABLE padded (c char(100000))") {
        Err(Refusal::Forbidden(m)) => assert!(m.contains(long), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(migration("CREATE TABLE padded (c char(256))"), Ok(()));
    // A length written as a string or a name, which PostgreSQL reads too.
    for sql in [
        "CREATE TABLE padded (c bpchar('10485760'))",
        "CREATE TABLE padded (c pg_catalog.bpchar('100000'))",
        "ALTER TABLE padded ALTER COLUMN c TYPE bpchar('100000')",
    ] {
        match migration(sql) {
            Err(Refusal::Forbidden(m)) => assert!(m.contains("at most char(256)"), "{sql}: {m}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
    // As many as the token bound lets through, padded: about 1.3 MB.
    let items = vec!["CAST('' AS char(256)) IS NULL"; 1_300].join(", ");
    allowed(&format!("SELECT {items}"));
    // An ordinary padded column or parameter still passes.
    allowed("SELECT CAST($1 AS char(12)), CAST('ab' AS char(3)) IS NULL");
}
