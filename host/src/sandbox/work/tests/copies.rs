//! Regression (the review of the nineteenth adversarial read, issue 23):
//! the planner copies a subquery's or CTE's computed columns into every
//! reference, so what a copy brings (expression nodes to plan, plan nodes
//! holding `work_mem`) counts once per reference, level by level. Since
//! then a subquery or CTE that computes columns must be fenced
//! (`sandbox::postgres::fences`): the statements that reached those copies
//! are refused before they are counted, and fenced ones are read as values.

use super::*;

/// `levels` derived tables, each reading the one below `refs` times in one
/// `coalesce`, over a literal; each ends with `fence`.
fn chain(levels: usize, refs: usize, fence: &str) -> String {
    let mut sql = "SELECT 1 AS x".to_owned();
    for level in 1..=levels {
        let read = vec![format!("p{level}.x"); refs].join(", ");
        sql = format!("SELECT coalesce({read}) AS x FROM ({sql}{fence}) AS p{level}");
    }
    format!("SELECT count(*) FROM ({sql}{fence}) AS z WHERE z.x IS NOT NULL")
}

/// The same as CTEs, each read once (so inlined by default).
fn cte_chain(levels: usize, refs: usize, materialized: &str) -> String {
    let mut ctes = vec!["c0 AS (SELECT 1 AS x)".to_owned()];
    for level in 1..=levels {
        let read = vec![format!("c{}.x", level - 1); refs].join(", ");
        ctes.push(format!(
            "c{level} AS {materialized}(SELECT coalesce({read}) AS x FROM c{})",
            level - 1
        ));
    }
    format!("WITH {} SELECT count(*) FROM c{levels}", ctes.join(", "))
}

#[test]
fn copies_of_derived_columns_are_planned_nodes_and_are_bounded() {
    // Measured on PostgreSQL 15: 4 levels of 10 plan in 5 ms, 6 in 0.4 s and
    // 335 MB, 8 in more than 6 GB, past every deadline.
    for sql in [chain(3, 10, ""), chain(8, 10, ""), cte_chain(3, 10, "")] {
        refused(&sql, UNFENCED);
    }
    // A fenced subquery or a stored CTE is read, not copied: measured on
    // PostgreSQL 15, eight fenced levels of ten plan in 0.9 ms and 15 MB
    // (six unfenced: 304 ms and 339 MB).
    allowed(&chain(8, 10, " OFFSET 0"));
    allowed(&cte_chain(8, 10, "MATERIALIZED "));
    // A derived `*` copies every column.
    let star = (1..=6).fold("SELECT 1 AS x, 2 AS y".to_owned(), |inner, level| {
        let read = vec![format!("p{level}.x, p{level}.y"); 5].join(", ");
        format!("SELECT coalesce({read}) AS x, coalesce({read}) AS y FROM (SELECT * FROM ({inner}) AS q) AS p{level}")
    });
    refused(&star, UNFENCED);
}

#[test]
fn a_subquery_in_a_derived_column_holds_memory_in_every_copy() {
    let functions = (0..30)
        .map(|i| format!("generate_series(1, 15000) AS a{i}(n)"))
        .collect::<Vec<_>>()
        .join(", ");
    let derived = format!("(SELECT (SELECT 1 FROM {functions} LIMIT 1) AS x) AS s");
    for sql in [
        format!("SELECT s.x FROM {derived}"),
        format!("SELECT s.x, s.x, s.x, s.x FROM {derived}"),
        format!(
            "WITH s AS (SELECT (SELECT 1 FROM {functions} LIMIT 1) AS x) SELECT (s.x IS NULL), s.x, s.x, s.x FROM s"
        ),
    ] {
        refused(&sql, UNFENCED);
    }
    // Its own 30 functions (2 nodes each) once: fenced, it is not copied.
    allowed(&format!(
        "SELECT s.x, s.x, s.x, s.x FROM (SELECT (SELECT 1 FROM {functions} LIMIT 1) AS x OFFSET 0) AS s"
    ));
    allowed(&format!(
        "WITH s AS MATERIALIZED (SELECT (SELECT 1 FROM {functions} LIMIT 1) AS x) SELECT s.x, s.x, s.x, s.x FROM s"
    ));
}

#[test]
fn a_recursive_cte_holds_no_subquery_in_from_or_with_of_its_own() {
    allowed(
        "WITH RECURSIVE r(k) AS (SELECT 1 UNION ALL SELECT r.k + 1 FROM r WHERE r.k < 10 \
         AND EXISTS (SELECT 1 FROM t WHERE t.a = r.k)) SELECT k FROM r",
    );
    for sql in [
        "WITH RECURSIVE r(k) AS (SELECT 1 UNION ALL SELECT s.k FROM (SELECT r.k + 1 AS k FROM r OFFSET 0) AS s \
         WHERE s.k < 10) SELECT k FROM r",
        "WITH RECURSIVE r(k) AS (SELECT 1 UNION ALL (WITH s AS MATERIALIZED (SELECT r.k + 1 AS k FROM r) \
         SELECT s.k FROM s WHERE s.k < 10)) SELECT k FROM r",
    ] {
        refused(sql, "may not hold a subquery in FROM");
    }
}

#[test]
fn a_qualifier_that_is_also_a_joins_or_tables_alias_is_not_trusted() {
    // `p.x` through the join alias is the costly `q.x`, though a cheap
    // subquery elsewhere is called `p` too.
    let mut inner = "SELECT 1 AS x".to_owned();
    for level in 1..=6 {
        let read = vec![format!("p.x"); 10].join(", ");
        inner = format!(
            "SELECT coalesce({read}) AS x FROM (({inner}) AS q{level} JOIN t ON true) AS p \
             WHERE EXISTS (SELECT 1 FROM (SELECT 1 AS x) AS p)"
        );
    }
    refused(&format!("SELECT count(*) FROM ({inner}) AS z"), UNFENCED);
}

#[test]
fn a_views_own_plan_is_no_more_than_a_reference_to_it_counts() {
    assert_eq!(
        migration("CREATE VIEW v AS SELECT t.a, u.b FROM t JOIN u ON u.a = t.a JOIN w ON w.a = u.a"),
        Ok(())
    );
    assert_eq!(
        migration("CREATE VIEW v AS SELECT t.a FROM t WHERE EXISTS (SELECT u.a FROM u WHERE u.a = t.a)"),
        Ok(())
    );
    // Each reference to it is its whole query: seven EXISTS over four tables.
    let exists = (0..7)
        .map(|i| {
            format!(
                "EXISTS (SELECT w0.a FROM u0 w0, u1 w1, u2 w2, u3 w3 WHERE w0.a = t.a AND w1.a = w0.b \
                 AND w2.a = w1.b AND w3.a = w2.b AND w0.c = {i})"
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ");
    for sql in [
        format!("CREATE VIEW v7 AS SELECT t.a, t.b FROM u0 AS t WHERE {exists}"),
        "CREATE VIEW v AS SELECT t.a FROM t, u, w, x WHERE EXISTS (SELECT y.a FROM y WHERE y.a = t.a)"
            .to_owned(),
    ] {
        let err = migration(&sql).unwrap_err().to_string();
        assert!(err.contains("in every statement that reads it"), "{sql}: {err}");
    }
}

#[test]
fn a_name_is_a_ctes_only_where_that_cte_is_visible() {
    // Thirty-two views count 256; CTEs called like them elsewhere change nothing.
    let views = (0..32)
        .map(|i| format!("v AS r{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    refused(
        &format!(
            "SELECT 1 FROM {views}, (SELECT 1 FROM (WITH v AS (SELECT 1 AS a) SELECT a FROM v) AS s) AS q"
        ),
        "plan nodes that each hold up to work_mem",
    );
    // A CTE is seen by the CTEs after it, not before.
    refused(
        &format!("WITH a AS (SELECT 1 FROM {views}), v AS (SELECT 1 AS x) SELECT 1 FROM a"),
        "plan nodes that each hold up to work_mem",
    );
    let ctes = (0..40)
        .map(|i| format!("c AS r{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    allowed(&format!(
        "WITH c AS MATERIALIZED (SELECT 1 AS a) SELECT 1 FROM {ctes}"
    ));
}

#[test]
fn a_long_literal_counts_in_every_copy_of_it() {
    let long = "x".repeat(6_000);
    let mut sql = format!("SELECT '{long}' AS x");
    for level in 1..=4 {
        let read = vec![format!("p{level}.x"); 6].join(", ");
        sql = format!("SELECT coalesce({read}) AS x FROM ({sql}) AS p{level}");
    }
    // 6^4 copies of 6,000 bytes would be 7.8 MB planned; a long literal
    // is no column that copies cheaply.
    refused(&format!("SELECT count(*) FROM ({sql}) AS z"), UNFENCED);
    refused(&format!("SELECT z.x FROM (SELECT '{long}' AS x) AS z"), UNFENCED);
    allowed("SELECT z.x, z.x FROM (SELECT 'short' AS x, $1::text AS y, a FROM t) AS z");
    allowed(&format!("SELECT '{long}' AS x, '{long}' AS y"));
}

/// `CASE WHEN x IS NULL THEN 0 ... END` over `column`, `n` arms.
fn case(n: usize, column: &str) -> String {
    let arms: Vec<String> = (0..n)
        .map(|i| format!("WHEN {column} IS NULL THEN {i}"))
        .collect();
    format!("CASE {} END", arms.join(" "))
}

/// Regression (the twentieth adversarial read, issue 23): a UNION's columns
/// are its first arm's names, and the planner pushes a condition into every
/// arm of a UNION ALL, each with a copy of that arm's expression.
#[test]
fn a_unions_column_costs_every_arms_expression() {
    let md5s = format!("concat({})", ["md5($1)"; 10].join(", "));
    for sql in [
        // The second arm's costly expression, under another name.
        format!(
            "SELECT count(*) FROM (SELECT a AS x FROM t UNION ALL SELECT {md5s} AS zzz FROM u) AS s WHERE {} IS NULL",
            case(300, "x")
        ),
        format!(
            "SELECT count(*) FROM (SELECT a AS x FROM t UNION ALL SELECT a FROM u UNION ALL SELECT {md5s} FROM v) AS s \
             WHERE {} IS NULL",
            case(300, "s.x")
        ),
    ] {
        refused(&sql, UNFENCED);
    }
    // Every arm's nodes, not the largest arm's.
    let arm = format!("SELECT coalesce({}) AS x FROM u", vec!["a"; 750].join(", "));
    let arms = vec![arm; 9].join(" UNION ALL ");
    refused(
        &format!(
            "SELECT count(*) FROM ({arms}) AS s WHERE {} IS NULL",
            case(100, "x")
        ),
        UNFENCED,
    );
    allowed("SELECT s.x FROM (SELECT a AS x FROM t UNION ALL SELECT b FROM u) AS s WHERE s.x > $1");
    // Tables' columns of the union's own name, qualified, are stored ones
    // (the twenty-first read: unqualified, they fed on the union's name).
    let tables = ["t", "u", "v", "w", "x"].map(|t| format!("SELECT {t}.a FROM {t}"));
    allowed(&format!(
        "SELECT s.a FROM ({}) AS s WHERE s.a = $1",
        tables.join(" UNION ALL ")
    ));
    // But a CTE's reader is no table, whatever its alias.
    let md5s = format!("concat({})", ["md5($1)"; 10].join(", "));
    refused(
        &format!(
            "WITH c AS (SELECT {md5s} AS a FROM t) SELECT count(*) FROM c AS p WHERE {} IS NULL",
            case(300, "p.a")
        ),
        UNFENCED,
    );
}

/// Regression (the twentieth adversarial read, issue 23): a VALUES list's
/// columns are `column1`, `column2`, ..., and a VALUES of one row is pulled
/// up into its reader, copied like a subquery.
#[test]
fn a_values_lists_columns_are_derived_columns() {
    let md5s = format!("concat({})", ["md5($1)"; 10].join(", "));
    refused(
        &format!(
            "SELECT count(*) FROM (VALUES ({md5s})) AS s WHERE {} IS NULL",
            case(300, "column1")
        ),
        UNFENCED,
    );
    let mut from = vec!["(VALUES ($1)) AS l0".to_owned()];
    for level in 1..=8 {
        let read = vec![format!("l{}.column1", level - 1); 10].join(", ");
        from.push(format!("LATERAL (VALUES (coalesce({read}))) AS l{level}"));
    }
    refused(
        &format!(
            "SELECT count(*) FROM {} WHERE l8.column1 IS NULL",
            from.join(", ")
        ),
        UNFENCED,
    );
    let sub = "(SELECT count(*) FROM (SELECT DISTINCT b FROM y) AS q)";
    refused(
        &format!("SELECT {} FROM (VALUES ({sub})) AS s", case(300, "column1")),
        UNFENCED,
    );
    allowed("SELECT v.column1, v.column2 FROM (VALUES ($1, $2), ($3, $4)) AS v WHERE v.column1 > 0");
}

/// Regression (the twenty-first adversarial read, issue 23): a VALUES as a
/// UNION's first arm, a CTE named like the table it reads (no RECURSIVE: it
/// is copied), and DEFAULT copied into each row of a VALUES list.
#[test]
fn first_arms_ctes_named_like_tables_and_defaults_are_counted() {
    let big = format!("concat({})", ["md5($1)"; 60].join(", "));
    for sql in [
        format!(
            "SELECT count(*) FROM (VALUES ('a') UNION ALL SELECT {big} FROM u) AS s WHERE column1 IS NULL"
        ),
        format!(
            "SELECT count(*) FROM (VALUES ({big}) UNION ALL SELECT 'a' FROM u) AS s WHERE s.column1 IS NULL"
        ),
        format!(
            "WITH u AS (SELECT {big} AS x FROM u) SELECT count(*) FROM u WHERE u.x IS NULL AND u.x IS NULL"
        ),
    ] {
        refused(&sql, UNFENCED);
    }
    refused(
        "INSERT INTO t (a, b) VALUES ($1, DEFAULT), ($2, DEFAULT)",
        "DEFAULT is not allowed in a VALUES list of several rows",
    );
    allowed("INSERT INTO t (a, b) VALUES ($1, DEFAULT)");
    allowed("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10) SELECT i FROM n");
}

/// Regression (the review of the twenty-first adversarial read, issue 23):
/// a schema-qualified name is never a CTE, and a `*` in a UNION's arm.
#[test]
fn a_schema_qualified_name_is_no_cte_and_stars_in_arms_count() {
    let big = format!("concat({})", ["md5($1)"; 60].join(", "));
    for sql in [
        format!(
            "WITH RECURSIVE u AS (SELECT {big} AS x FROM handler_h.u) SELECT count(*) FROM u WHERE u.x IS NULL AND u.x IS NULL"
        ),
        format!(
            "SELECT count(*) FROM (SELECT 'a' AS p, 'b' AS q FROM u UNION ALL SELECT * FROM (SELECT 'x' AS m, {big} AS n \
             FROM u) AS z) AS s WHERE s.q IS NULL AND s.q IS NULL"
        ),
    ] {
        refused(&sql, UNFENCED);
    }
    allowed("SELECT s.a FROM (SELECT * FROM t UNION ALL SELECT * FROM u) AS s WHERE s.a = $1");
}
