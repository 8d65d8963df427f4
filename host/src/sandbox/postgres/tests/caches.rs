//! What a session would keep, or a row would hold, past what the walls
//! bound: anonymous record types, time zones read from text, and jsonb.

use super::*;

/// Regression (the forty-second adversarial read, issue 23): a row that
/// PostgreSQL evaluates as a value registers a record type of its shape in
/// the session for good (50 statements of 441 distinct 60-column rows: 208
/// MB past `DISCARD ALL`). A row constructor stands only where it is
/// compared column by column.
#[test]
fn a_row_constructor_stands_only_where_it_is_taken_apart() {
    for sql in [
        "SELECT CAST((1, 'a') AS text)",
        "SELECT ROW(1, 2)",
        "SELECT a FROM t WHERE (a, b) = $1",
        "SELECT a FROM t WHERE ((a, b), 1) = ((1, 2), 1)",
        "SELECT coalesce((a, b), (b, a)) IS NULL FROM t",
        "INSERT INTO t (a) VALUES ((1, 2)::text)",
        // Taken apart only when written without ROW, at the top of the list.
        "SELECT count(*) FROM t GROUP BY ROW(a, b)",
        "SELECT count(*) FROM t GROUP BY lower((a, b)::text)",
        // PostgreSQL compares a row with a subquery's columns only under an operator.
        "SELECT a FROM t WHERE (a, b) IS DISTINCT FROM (SELECT a, b FROM t LIMIT 1)",
        "SELECT a FROM t WHERE (SELECT a, b FROM t LIMIT 1) = (a, b)",
    ] {
        refused(sql, "row constructor");
    }
    for sql in [
        "SELECT a FROM t WHERE (a, b) = ($1, $2)",
        "SELECT a FROM t WHERE (a, b) < ($1, $2) AND (a, b) IS DISTINCT FROM (1, 2)",
        "UPDATE t SET (a, b) = ($1, $2)",
        // The forty-fourth read's false positives, which PostgreSQL takes apart.
        "SELECT a FROM t WHERE (a, b) = (SELECT a, b FROM t LIMIT 1)",
        "SELECT a, b, count(*) FROM t GROUP BY (a, b)",
    ] {
        allowed(sql);
    }
    refused("SELECT a ~ 'x' FROM t", "operator ~");
    refused("SELECT a OPERATOR(pg_catalog.~) 'x' FROM t", "operator");
    refused("SELECT a FROM t ORDER BY a USING ~<~", "operator ~<~");
    refused(
        "SELECT a = ANY (SELECT b FROM u) OR a @@ 'x' FROM t",
        "operator @@",
    );
    refused("SELECT a SIMILAR TO 'x' FROM t", "SIMILAR TO");
    refused("SELECT lower(VARIADIC ARRAY['a'])", "VARIADIC");
    refused("SELECT lower(a => 'x')", "named function arguments");
    refused("SELECT xmlparse(document '<a/>')", "XML");
    refused(
        "SELECT * FROM generate_series(1, 3) g, pg_ls_dir('.') d",
        "pg_ls_dir",
    );
    refused("SELECT generate_series(1, 3)", "generate_series");
    // Attribute notation on a FROM function's value (an adversarial read).
    refused("SELECT u.ts_stat FROM unnest(ARRAY[$1::text]) AS u", "u.ts_stat");
    refused(
        "SELECT g.pg_advisory_lock FROM generate_series(1, 1) g",
        "g.pg_advisory_lock",
    );
    refused("SELECT unnest.ts_stat FROM unnest($1::text[])", "unnest.ts_stat");
    refused("SELECT u.ts_stat FROM unnest($1::text[]) AS u(v)", "u.ts_stat");
    allowed("SELECT u.v FROM unnest($1::text[]) AS u(v)");
    allowed("SELECT u FROM unnest($1::text[]) AS u");
    // Containment and overlap loop over both sides, uninterruptibly.
    refused("SELECT $1::int[] && $2::int[]", "operator &&");
    refused("SELECT $1::int8[] @> $2::int8[]", "operator @>");
    refused("SELECT * INTO t2 FROM t", "INTO");
    refused("SELECT x FROM current_user", "function calls");
    refused("SET ROLE postgres", "session settings");
    refused("COMMIT", "transaction control");
}

/// Regression (the tenth adversarial read, issue 23): reading a value into
/// jsonb's tree held about 170 MB per operator over one 1 MiB row
/// (`j - 'x'`), so jsonb is refused wherever PostgreSQL's reading names it:
/// casts, column types, the jsonb builders and table functions. json stays.
#[test]
fn jsonb_is_refused_and_json_is_not() {
    for sql in [
        "SELECT $1::jsonb",
        "SELECT CAST($1 AS jsonb) ->> 'a'",
        "SELECT '{}'::jsonb - $1::text",
        "SELECT jsonb '[]'",
        "SELECT $1::jsonb[]",
        "SELECT jsonb_build_array(a) FROM t",
        "SELECT jsonb_build_object('a', a) FROM t",
        "SELECT * FROM jsonb_each($1::json)",
        "SELECT * FROM jsonb_array_elements('[]')",
    ] {
        refused(sql, "jsonb is not allowed on PostgreSQL");
    }
    allowed("SELECT $1::json -> 'a', json_build_object('a', a), json_build_array(a) FROM t");
    allowed("SELECT k, v FROM json_each($1::json) AS e(k, v)");
    let migration = |sql: &str| checked(sql, Mode::Migration);
    for sql in [
        "CREATE TABLE docs (id BIGINT, body JSONB)",
        "ALTER TABLE docs ADD COLUMN extra jsonb",
        "ALTER TABLE docs ALTER COLUMN body TYPE jsonb",
    ] {
        match migration(sql) {
            Err(Refusal::Forbidden(m)) => assert!(m.contains("jsonb is not allowed"), "{sql}: {m}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
    assert_eq!(migration("CREATE TABLE docs (id BIGINT, body JSON)"), Ok(1));
}

/// Regression (the eleventh adversarial read, issue 23): an untyped string
/// literal takes its type from its context, and beside `-` (with a text on
/// the other side) or `?` that type is jsonb.
#[test]
fn no_untyped_literal_becomes_jsonb() {
    for sql in [
        "SELECT ('[[0],[0]]' - 'x'::text) IS NULL",
        "SELECT '[1]' - ARRAY['x']",
        "SELECT a - '[1]' FROM t",
    ] {
        refused(sql, "untyped string literal beside `-`");
    }
    refused("SELECT '{\"a\": 1}' ? 'a'", "operator ? is not allowed");
    allowed("SELECT CAST('2024-01-02' AS date) - 1, a - 1, now() - interval '1 day', 'a' || b FROM t");
}

/// Regression (the forty-second adversarial read, issue 23): a session keeps
/// every time zone it reads from text for as long as it lives, and a POSIX
/// rule (`qaab+1qab`) is a new one each time (20,000 held 480 MB). Text
/// becomes a date or time only from a literal, which holds no such rule, or
/// a parameter, which the host checks when it binds it.
#[test]
fn text_becomes_a_date_or_time_only_where_its_zones_are_checked() {
    for (sql, because) in [
        ("SELECT CAST(a AS timestamptz) FROM t", "a cast to a date or time"),
        (
            "SELECT CAST('2020-01-01 ' || a AS date) FROM t",
            "a cast to a date or time",
        ),
        ("SELECT date(a) FROM t", "a cast to a date or time"),
        (
            "SELECT CAST(u.x AS timestamptz) FROM unnest($1::text[]) AS u(x)",
            "a cast to a date or time",
        ),
        (
            "SELECT x FROM unnest($1::timestamptz[]) AS u(x)",
            "an array of dates or times",
        ),
        (
            "SELECT a FROM t WHERE created > '2020-01-01 qaab+1qab'",
            "POSIX rule",
        ),
        ("SELECT CAST('1-1-1 abc+1' AS timestamptz)", "POSIX rule"),
        // The forty-fourth read: through a cast to text, and with fewer letters.
        (
            "SELECT CAST(CAST('1-1-1 qaab+1qab' AS text) AS timestamptz)",
            "POSIX rule",
        ),
        ("SELECT date('1-1-1 qq1:00:10'::varchar)", "POSIX rule"),
        ("SELECT a FROM t WHERE created > '1-1-1 a.b+1'", "POSIX rule"),
        // The forty-fifth read: a time of day's text names a zone at its
        // start, with no date before it; no value may be a time.
        (
            "SELECT CAST('qaab+1 101010' AS time)",
            "time and timetz are not allowed",
        ),
        ("SELECT CAST($1 AS timetz)", "time and timetz are not allowed"),
        (
            "SELECT 1 WHERE localtime IN ('qzz+1 101010')",
            "time and timetz are not allowed",
        ),
        (
            "SELECT 1 WHERE current_time < '12:00'",
            "time and timetz are not allowed",
        ),
        ("SELECT time 'qaab+1 101010'", "time and timetz are not allowed"),
        (
            "SELECT g FROM generate_series(now(), now(), CAST('1 day' AS interval), $1) AS g",
            "generate_series(from, to, step, zone)",
        ),
    ] {
        refused(sql, because);
    }
    for sql in [
        "SELECT a FROM t WHERE created > $1::timestamptz",
        "SELECT a FROM t WHERE created > CAST($1::text AS date)",
        "SELECT date_trunc('day', created)::date FROM t",
        "SELECT CAST(now() AS date), CURRENT_DATE::timestamp",
        "SELECT g FROM generate_series(now(), now() + CAST('2 days' AS interval), CAST('1 day' AS interval)) AS g",
        "SELECT '2024-01-01 12:00 Europe/Paris'::timestamptz",
        "SELECT a FROM t WHERE code = 'ORD-123'::text",
        "SELECT a FROM t WHERE code = 'ORD-123' OR name = 'sha256'",
    ] {
        allowed(sql);
    }
    let run_time = check_run_time(
        "SELECT $3::text, $2::timestamptz, CAST($1::text AS date)",
        1 << 20,
        &Catalog::default(),
    )
    .unwrap();
    assert_eq!(run_time.zoned_params, [1, 2]);
}

/// Regression (the forty-fourth adversarial read, issue 23): a whole row of a
/// function with several columns, or of a CTE read under an alias, is an
/// anonymous record too (a new type for each list of column names, kept by
/// the session for good).
#[test]
fn a_whole_row_is_a_tables_or_one_plain_value() {
    for sql in [
        "SELECT u FROM unnest($1::bigint[], $2::text[]) AS u(k, v)",
        "SELECT u FROM unnest($1::bigint[]) AS u(k)",
        "SELECT g FROM generate_series(1, 2) WITH ORDINALITY AS g(n, o)",
        "WITH w AS (SELECT a, b FROM t) SELECT x FROM w AS x",
    ] {
        refused(sql, "whole row");
    }
    for sql in [
        "SELECT u FROM unnest($1::text[]) AS u",
        "SELECT u.k, u.v FROM unnest($1::bigint[], $2::text[]) AS u(k, v)",
        "WITH w AS (SELECT a, b FROM t) SELECT x.a FROM w AS x",
        "SELECT x FROM t AS x",
    ] {
        allowed(sql);
    }
}
