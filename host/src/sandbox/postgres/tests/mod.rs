//! The PostgreSQL statement guard's tests: what it allows and refuses.

use super::*;

/// As the guard calls it: on its own stack.
fn checked(sql: &str, mode: Mode) -> Result<usize, Refusal> {
    super::super::nesting::on_guard_stack(|| check(sql, mode, 1 << 20, &Catalog::default()))
}

fn allowed(sql: &str) {
    assert_eq!(checked(sql, Mode::RunTime), Ok(1), "{sql}");
}

fn refused(sql: &str, because: &str) {
    match checked(sql, Mode::RunTime) {
        Err(Refusal::Forbidden(m) | Refusal::Limit(m)) => {
            assert!(
                m.contains(because),
                "{sql}\n  refused with {m:?}, expected {because:?}"
            )
        }
        Ok(_) => panic!("allowed: {sql}"),
    }
}

#[test]
fn a_handlers_ordinary_statements_pass() {
    allowed("INSERT INTO invoices (order_id, amount_cents) VALUES ($1, $2::bigint)");
    allowed(
        "INSERT INTO invoices (order_id) VALUES ($1) ON CONFLICT (order_id) DO UPDATE SET n = invoices.n + 1",
    );
    allowed("UPDATE invoices SET amount_cents = amount_cents + 1 WHERE order_id = $1");
    allowed("DELETE FROM invoices WHERE order_id = ANY($1::text[])");
    allowed(
        "WITH recent AS (SELECT * FROM invoices ORDER BY created DESC LIMIT 10) \
         SELECT count(*), max(amount_cents), coalesce(sum(amount_cents), 0) FROM recent r JOIN customers c ON c.id = r.customer_id",
    );
    refused("SELECT a FROM t WHERE a LIKE $1", "LIKE");
    refused("SELECT a FROM t WHERE a ILIKE $1", "LIKE");
    refused("SELECT a FROM t WHERE a OPERATOR(pg_catalog.~~) $1", "operator");
    refused("SELECT string_agg(a, '') FROM t", "string_agg");
    allowed("SELECT i.* FROM invoices i WHERE left(i.order_id, 3) = $1 AND lower(i.customer_email) = $2");
    allowed(
        "SELECT trim(order_id), substring(order_id FROM 2 FOR 3), extract(year FROM now()) FROM invoices",
    );
    allowed("SELECT CASE WHEN a IS NULL THEN 0 ELSE a END, payload ->> 'id' FROM t");
    allowed("SELECT * FROM unnest($1::text[]) AS u(id) WHERE EXISTS (SELECT 1 FROM t WHERE t.id = u.id)");
    allowed("SELECT DATE '2020-01-01', INTERVAL '1 day', CURRENT_TIMESTAMP, $1::timestamptz");
    allowed("SELECT row_number() OVER (PARTITION BY a ORDER BY b) FROM t FOR UPDATE");
}

/// Regression (issue 23): attribute notation is a call to PostgreSQL;
/// the guard's own parser read it as a field access.
#[test]
fn every_syntax_postgres_reads_as_a_call_is_judged_as_one() {
    refused("SELECT ('SELECT 1'::text).ts_stat", "field access");
    refused("SELECT (order_id).ts_stat FROM invoices", "field access");
    refused(
        "SELECT invoices.order_id.ts_stat FROM invoices",
        "more than two parts",
    );
    refused("SELECT arr[1] FROM t", "subscripts");
    refused("SELECT ts_stat('SELECT 1')", "ts_stat");
    refused("SELECT pg_catalog.set_config('role', 'none', true)", "set_config");
    refused("SELECT handler_x.lower(a) FROM t", "handler_x.lower");
    refused("SELECT 'pg_catalog.set_config'::regproc", "regproc");
    refused("SELECT CAST('inbox' AS regclass)", "regclass");
    refused("SELECT 'a'::tsquery", "tsquery");
    refused("SELECT a COLLATE \"C\" FROM t", "COLLATE");
    refused("SELECT POSITION('a' IN b) FROM t", "position");
    refused("SELECT TRIM(BOTH 'xy' FROM b) FROM t", "btrim(x, characters)");
    refused("SELECT now() AT TIME ZONE 'UTC'", "timezone");
    // The forty-second read: a zone a session names is kept for its life.
    refused(
        "SELECT date_trunc('day', now(), $1)",
        "date_trunc(field, source, zone)",
    );
    allowed("SELECT date_trunc('day', now())");
}

#[test]
fn statements_are_counted_as_postgres_splits_them() {
    assert_eq!(
        check("SELECT 1; SELECT 2", Mode::RunTime, 1 << 20, &Catalog::default()),
        Ok(2)
    );
    // A nested block comment is one comment to PostgreSQL.
    assert_eq!(
        check(
            "SELECT 1 /* a /* b */ ; SELECT 2 */",
            Mode::RunTime,
            1 << 20,
            &Catalog::default()
        ),
        Ok(1)
    );
}

#[test]
fn migrations_may_hold_their_ddl_with_the_same_expression_rules() {
    let ok = |sql: &str| {
        assert_eq!(
            check(sql, Mode::Migration, 1 << 20, &Catalog::default()),
            Ok(1),
            "{sql}"
        )
    };
    ok(
        "CREATE TABLE emails (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body TEXT DEFAULT lower('X') CHECK (length(body) < 100))",
    );
    ok("CREATE INDEX emails_body ON emails (lower(body))");
    ok("ALTER TABLE emails ADD COLUMN extra TEXT DEFAULT ''");
    ok("CREATE VIEW recent AS SELECT * FROM emails");
    ok("DROP TABLE emails");
    let refused = |sql: &str, because: &str| match check(sql, Mode::Migration, 1 << 20, &Catalog::default()) {
        Err(Refusal::Forbidden(m)) => assert!(m.contains(because), "{sql}: {m}"),
        other => panic!("{sql}: {other:?}"),
    };
    refused(
        "CREATE TABLE t (a TEXT DEFAULT (('SELECT 1'::text).ts_stat))",
        "field access",
    );
    refused(
        "CREATE TABLE t (a TEXT CHECK (set_config('role', 'x', false) IS NOT NULL))",
        "set_config",
    );
    refused("CREATE INDEX i ON t (('x'::regclass))", "regclass");
    refused("CREATE TABLE t (a regclass)", "a column of type");
    refused("CREATE TABLE t (id SERIAL PRIMARY KEY)", "identity column");
    refused("ALTER TABLE t ADD COLUMN a tsquery", "a column of type");
    ok("CREATE TABLE t (a TIMESTAMPTZ, b NUMERIC(10, 2), c VARCHAR(20), d JSON, e UUID, f BYTEA)");
    assert!(
        check(
            "CREATE TABLE t (a TEXT)",
            Mode::RunTime,
            1 << 20,
            &Catalog::default()
        )
        .is_err()
    );
}

/// libpg_query and its tree's reader recurse per level, past a
/// default thread's stack at about 900 levels: the guard runs them on
/// its own stack (`nesting::on_guard_stack`), where a statement at the
/// nesting bound is a refusal, never a crash.
#[test]
fn a_chain_at_the_nesting_bound_is_a_limit_not_a_crash() {
    let chain = format!("SELECT 1{}", "+1".repeat(super::super::nesting::MAX_NESTING - 10));
    let checked =
        super::super::nesting::on_guard_stack(|| check(&chain, Mode::RunTime, 1 << 20, &Catalog::default()));
    assert!(matches!(checked, Err(Refusal::Limit(_))), "{checked:?}");
    // The longest chain it reads.
    let longest = super::super::nesting::on_guard_stack(|| {
        Ok((1..200)
            .take_while(|n| {
                check(
                    &format!("SELECT 1{}", "+1".repeat(*n)),
                    Mode::RunTime,
                    1 << 20,
                    &Catalog::default(),
                )
                .is_ok()
            })
            .last())
    })
    .unwrap();
    assert!(longest.is_some_and(|n| n >= 30), "{longest:?}");
    eprintln!("longest chain read: {longest:?}");
}

/// Regression (the ninth adversarial read, issue 23): `substring` with a text
/// pattern is a regular expression; only its integer forms pass.
#[test]
fn substring_takes_integer_positions_only() {
    allowed("SELECT substring(a FROM 2 FOR 3), substring(a, 2), substring(a FOR 4) FROM t");
    allowed(
        "SELECT substring(a FROM CAST($1 AS integer) FOR $2::int8), substring(a, -1, 3::smallint) FROM t",
    );
    for sql in [
        r"SELECT substring(a, '^(a*)\1$') FROM t",
        "SELECT substring(a FROM 'x+') FROM t",
        "SELECT substring(a SIMILAR '%x%' ESCAPE '#') FROM t",
        "SELECT substring(a, $1) FROM t",
        "SELECT substring(a, b, c) FROM t",
        "SELECT substring(a FROM 2 FOR $1) FROM t",
        "SELECT substring(a, $1::text) FROM t",
        "SELECT substring(a, $1::int4[]) FROM t",
    ] {
        refused(sql, "regular expression");
    }
}

/// Regression (the ninth adversarial read, issue 23): `q.name` is the call
/// `name(q)` on the whole row when q has no such column, so a qualified name
/// that the database says is such a function is refused wherever it stands.
/// The live list is read from PostgreSQL (`db::migrate::row_functions`,
/// tested on a real server); this is the check over a stand-in.
#[test]
fn a_qualified_name_that_is_a_whole_row_function_is_refused() {
    let catalog = Catalog {
        row_functions: Some(["json_build_array", "json_agg", "count"].map(String::from).into()),
        ..Catalog::default()
    };
    let judged =
        |sql: &str| super::super::nesting::on_guard_stack(|| check(sql, Mode::RunTime, 1 << 20, &catalog));
    for sql in [
        "SELECT count(*) FROM t1 WHERE t1.json_build_array IS NOT NULL",
        "SELECT s.json_agg FROM (SELECT a FROM t) s",
        "WITH c AS (SELECT a FROM t) SELECT md5(c.json_agg::text) FROM c",
        "INSERT INTO t (a, count) VALUES ($1, 1) ON CONFLICT (a) DO UPDATE SET count = excluded.count",
        "UPDATE t SET a = $1 RETURNING t.count",
    ] {
        match judged(sql) {
            Err(Refusal::Forbidden(m)) => assert!(m.contains("on the whole row"), "{sql}: {m}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
    // Unqualified, a name is only ever a column; other qualified names pass.
    for sql in [
        "SELECT count, json_agg FROM t",
        "SELECT t.a, t.b FROM t JOIN u ON u.id = t.id",
        "INSERT INTO t (a, n) VALUES ($1, 1) ON CONFLICT (a) DO UPDATE SET n = excluded.n + t.n",
    ] {
        assert_eq!(judged(sql), Ok(1), "{sql}");
    }
    // Without the database's list (a first reading, tests) nothing is refused for it.
    assert_eq!(
        checked("SELECT t1.json_build_array FROM t1", Mode::RunTime),
        Ok(1)
    );
}

/// Regression (the eighteenth adversarial read and its review, issue 23): a
/// top-N sort keeps LIMIT + OFFSET rows in memory whatever their size, and
/// PostgreSQL hands an outer LIMIT down to a nested sort.
#[test]
fn sorted_limits_are_small_literals_over_plain_columns() {
    for sql in [
        "SELECT a FROM t ORDER BY a LIMIT 1",
        "SELECT * FROM t ORDER BY a DESC LIMIT 1",
        "SELECT a, 1 FROM t ORDER BY a LIMIT 54 OFFSET 10",
        "SELECT a, $1, upper(a) FROM t ORDER BY lower(a) LIMIT 10",
        "SELECT a FROM t ORDER BY a LIMIT 0",
        "SELECT a FROM t ORDER BY a FETCH FIRST 5 ROWS ONLY",
        "SELECT t.a FROM t JOIN u ON u.a = t.a ORDER BY t.a LIMIT 32",
        "SELECT a FROM t LIMIT 100000",
        "SELECT a, upper(a) FROM t ORDER BY a",
        "SELECT a FROM t ORDER BY a OFFSET 100000",
        "INSERT INTO t (a) SELECT a FROM u ORDER BY a",
        "WITH recent AS (SELECT a FROM t ORDER BY a DESC LIMIT 10) SELECT count(*) FROM recent",
        "SELECT sum(1.5e3), 12345678901234567890.5 FROM t",
        "SELECT a FROM t WHERE a > 1 AND EXISTS (SELECT 1 FROM u WHERE u.a = t.a) AND NOT EXISTS (SELECT 1 FROM u)",
        "SELECT t.a FROM t JOIN u ON u.a = t.a AND EXISTS (SELECT 1 FROM u AS v WHERE v.a = t.a)",
        "UPDATE t SET a = 1 WHERE EXISTS (SELECT 1 FROM u WHERE u.a = t.a)",
    ] {
        allowed(sql);
    }
    for (sql, because) in [
        ("SELECT a FROM t ORDER BY a LIMIT 101", "integer literals"),
        ("SELECT a FROM t ORDER BY a LIMIT 65", "keeps up to 260 MiB"),
        (
            "SELECT a FROM t ORDER BY a LIMIT 91 OFFSET 10",
            "integer literals",
        ),
        ("SELECT a FROM t ORDER BY a LIMIT $1", "integer literals"),
        ("SELECT a FROM t ORDER BY a LIMIT 1 + 1", "integer literals"),
        ("SELECT a FROM t ORDER BY a LIMIT ALL", "integer literals"),
        ("SELECT a FROM t ORDER BY a LIMIT 5 OFFSET $1", "integer literals"),
        (
            "SELECT d.v FROM (SELECT $1 AS v, a FROM t) AS d ORDER BY d.a LIMIT 5",
            "rows of tables",
        ),
        (
            "SELECT g FROM generate_series(1, 10) AS s(g) ORDER BY g LIMIT 5",
            "rows of tables",
        ),
        (
            "(SELECT a FROM t) UNION ALL (SELECT a FROM u) ORDER BY a LIMIT 5",
            "rows of tables",
        ),
        (
            "SELECT t.a FROM t JOIN u ON u.a = t.a ORDER BY t.a LIMIT 33",
            "keeps up to 264 MiB",
        ),
        // The review's wide rows: sixteen copies of a parameter in each.
        (
            "SELECT CASE WHEN a > 3 THEN $1 ELSE 'x' END, CASE WHEN a > 3 THEN $1 ELSE 'x' END, \
             CASE WHEN a > 3 THEN $1 ELSE 'x' END, CASE WHEN a > 3 THEN $1 ELSE 'x' END FROM t ORDER BY a LIMIT 20",
            "keeps up to",
        ),
        // The second review: a CTE's row is computed, and so is a call's value.
        (
            "WITH c AS MATERIALIZED (SELECT $1 AS a1, $1 AS a2, 0 - s.g AS k FROM generate_series(1, 400) AS s(g)) \
             SELECT c.a1, c.a2 FROM c ORDER BY c.k LIMIT 5",
            "keeps up to",
        ),
        (
            "SELECT concat(t.v, t.v, t.v, t.v, t.v, t.v, t.v, t.v) FROM t ORDER BY t.k LIMIT 8",
            "keeps up to",
        ),
        // Its third review (C5): a subquery's column may be a CTE's.
        (
            "WITH c AS MATERIALIZED (SELECT concat($1, $1, $1, $1) AS v FROM generate_series(1, 9) AS s(g)) \
             SELECT (SELECT c.v FROM c LIMIT 1) FROM t ORDER BY t.a LIMIT 20",
            "keeps up to",
        ),
        // Every sort of a statement holds its rows until it ends.
        (
            "SELECT count(*) FROM (SELECT a FROM t ORDER BY a LIMIT 40) AS x, (SELECT a FROM u ORDER BY a LIMIT 40) AS y",
            "keep up to 320 MiB in memory together",
        ),
        // The review's reproducer: the sort is inside, the LIMIT outside
        // (its computed columns are refused first now: `fences`).
        (
            "SELECT max(length(e.v)) FROM (SELECT d.v FROM (SELECT CASE WHEN s.g > 3000 THEN $1 ELSE 'x' END AS v, \
             0 - s.g AS k FROM generate_series(1, 6000) AS s(g) ORDER BY k) AS d LIMIT 2000) AS e",
            "copy each computed column into every place that reads it",
        ),
        (
            "SELECT a FROM (SELECT a FROM t ORDER BY a) AS s LIMIT 5",
            "needs a LIMIT of its own",
        ),
        (
            "WITH s AS (SELECT a FROM t ORDER BY a) SELECT a FROM s LIMIT 5",
            "needs a LIMIT of its own",
        ),
        (
            "SELECT a FROM t UNION ALL (SELECT a FROM u ORDER BY a)",
            "needs a LIMIT of its own",
        ),
        (
            "SELECT count(*) FROM t FULL JOIN u ON u.a = t.a",
            "FULL JOIN is not allowed",
        ),
    ] {
        refused(sql, because);
    }
}

/// Regression (the seventeenth adversarial read, issue 23): PostgreSQL 15
/// holds these hash tables in memory whatever `work_mem` says; a recursive
/// UNION over a 1 MiB value grew one backend by 420 MB a second.
#[test]
fn hash_tables_that_never_spill_are_refused() {
    for (sql, because) in [
        (
            "WITH RECURSIVE r(k, v) AS (SELECT 1, CAST($1 AS text) UNION SELECT r.k + 1, r.v FROM r WHERE r.k < 100) \
             SELECT count(*) FROM r",
            "UNION ALL",
        ),
        ("SELECT a FROM t EXCEPT SELECT a FROM t", "EXCEPT and INTERSECT"),
        (
            "SELECT a FROM t INTERSECT SELECT a FROM t",
            "EXCEPT and INTERSECT",
        ),
        ("SELECT a FROM t WHERE a NOT IN (SELECT a FROM t)", "IN (SELECT"),
        ("SELECT a FROM t WHERE a IN (SELECT a FROM t)", "IN (SELECT"),
        ("SELECT a = ANY (SELECT a FROM t) FROM t", "IN (SELECT"),
        ("SELECT a FROM t WHERE a <> ALL (SELECT a FROM t)", "IN (SELECT"),
    ] {
        refused(sql, because);
    }
    allowed(
        "WITH RECURSIVE r(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM r WHERE k < 100) \
         SELECT k FROM r WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.a = r.k) UNION SELECT a FROM t",
    );
    allowed("SELECT a FROM t WHERE a IN (1, 2, 3)");
}

/// Regression (the nineteenth adversarial read, issue 23): what PostgreSQL
/// holds by `work_mem` per plan node, copies per reference, or lets grow
/// after a hash aggregate made a group.
#[test]
fn plans_hold_a_bounded_number_of_memory_nodes_and_nothing_multiplies_them() {
    let many =
        |n: usize, item: &dyn Fn(usize) -> String, sep: &str| (0..n).map(item).collect::<Vec<_>>().join(sep);
    for sql in [
        "SELECT t.a, sum(t.b) FROM t GROUP BY t.a",
        "SELECT t.a, avg(t.b * t.c) FROM t GROUP BY t.a",
        "SELECT t.a, sum(CAST(t.b * t.c * t.d AS numeric(20, 2))) FROM t GROUP BY t.a",
        "WITH c AS MATERIALIZED (SELECT a FROM t) SELECT count(*) FROM c AS x, c AS y",
        "SELECT t.a FROM t LEFT JOIN u ON u.a = t.a WHERE NOT EXISTS (SELECT 1 FROM u AS v WHERE v.a = t.a)",
        "SELECT * FROM t, u",
        "SELECT t.*, u.a FROM t JOIN u ON u.a = t.a",
        "WITH c AS (SELECT $1 AS a0 FROM t) SELECT c.* FROM c",
        "SELECT a FROM t WHERE t.a BETWEEN $1 AND upper($2) AND lower(t.b) IN ('x', $3, CAST($4 AS text))",
        "SELECT a FROM t WHERE t.a IN (t.b, t.c) AND CAST(t.a AS numeric(12, 2)) > 0",
    ] {
        allowed(sql);
    }
    allowed(&format!(
        "SELECT * FROM {}",
        many(16, &|i| format!("t AS a{i}"), ", ")
    ));
    for (sql, because) in [
        // F1: a sum's state grows after its group was made.
        (
            "SELECT b.n, sum(CASE WHEN a.n = 1 THEN 0 ELSE 0.0 + '1e131071' END) FROM generate_series(1, 1000000) \
             AS a(n), generate_series(1, 1000000) AS b(n) GROUP BY b.n"
                .to_owned(),
            "sum() over a number of up to",
        ),
        (
            "SELECT t.a, sum(1e999 * 1e999 * 1e999) FROM t GROUP BY t.a".to_owned(),
            "sum() over a number of up to",
        ),
        // F2: an outer join's ON, and an EXISTS with a WITH of its own.
        (
            "SELECT count(*) FROM t LEFT JOIN u ON u.a = t.a AND EXISTS (SELECT 1 FROM v WHERE concat($1, v.a) = \
             concat($1, t.a))"
                .to_owned(),
            "inner join's ON",
        ),
        (
            "SELECT count(*) FROM t WHERE EXISTS (WITH c AS MATERIALIZED (SELECT concat($1, v.a) AS k FROM v) SELECT 1 FROM c \
             WHERE c.k = t.a)"
                .to_owned(),
            "EXISTS (WITH ...) is not allowed",
        ),
        // F3, F5: copied into every reference.
        (
            "WITH c0 AS NOT MATERIALIZED (SELECT 1 AS x), c1 AS NOT MATERIALIZED (SELECT 1 AS x FROM c0 AS a, c0 AS b) \
             SELECT count(*) FROM c1"
                .to_owned(),
            "NOT MATERIALIZED is not allowed",
        ),
        // F4: one row of every relation's columns.
        (
            format!("SELECT * FROM {}", many(17, &|i| format!("t AS a{i}"), ", ")),
            "one row of up to 68 values",
        ),
        // Its review: a CTE's row is computed, and RETURNING * counts too.
        (
            "WITH c AS (SELECT $1 AS a1, $1 AS a2 FROM t) SELECT * FROM c, t".to_owned(),
            "one row of up to 68 values",
        ),
        (
            format!("UPDATE t SET a = 1 FROM {} RETURNING *", many(16, &|i| format!("u AS a{i}"), ", ")),
            "one row of up to 68 values",
        ),
        // Its review (R4b): a qualified star covers what its name does.
        (
            "WITH c AS (SELECT $1 AS a0, $1 AS a1 FROM t) SELECT j.* FROM (c AS x0 CROSS JOIN c AS x1) AS j"
                .to_owned(),
            "one row of up to 128 values",
        ),
        // Its review: ON CONFLICT's WHERE is no join.
        (
            "INSERT INTO t (id, v) SELECT 1, 'y' FROM u ON CONFLICT (id) DO UPDATE SET v = excluded.v \
             WHERE EXISTS (SELECT 1 FROM w WHERE w.a = t.v) RETURNING t.id"
                .to_owned(),
            "EXISTS is allowed only",
        ),
        // Its review: PostgreSQL copies BETWEEN's and IN's left side.
        (
            "SELECT a FROM t WHERE ((t.a BETWEEN 0 AND 1) BETWEEN false AND true) BETWEEN false AND true".to_owned(),
            "the left side of BETWEEN",
        ),
        (
            "SELECT a FROM t WHERE upper(t.a) IN (t.b, t.c)".to_owned(),
            "the left side of BETWEEN",
        ),
        (
            "SELECT a FROM t WHERE t.a BETWEEN SYMMETRIC upper(t.b) AND 'z'".to_owned(),
            "the left side of BETWEEN",
        ),
        (
            "SELECT CAST(1e999 AS numeric(1, -999)) FROM t".to_owned(),
            "a numeric's scale must be between 0 and its precision",
        ),
        // F6: work_mem per node.
        (
            format!(
                "SELECT count(*) FROM {}",
                many(130, &|i| format!("generate_series(1, 80000) AS a{i}(n)"), ", ")
            ),
            "plan nodes that each hold up to work_mem",
        ),
        (
            format!("SELECT {} FROM t", many(300, &|i| format!("sum({i} ORDER BY t.a)"), ", ")),
            "plan nodes that each hold up to work_mem",
        ),
    ] {
        refused(&sql, because);
    }
    let view = |sql: &str| check(sql, Mode::Migration, 1 << 20, &Catalog::default());
    assert_eq!(
        view("CREATE VIEW v AS SELECT t.a, u.b FROM t JOIN u ON u.a = t.a WHERE t.a > 0"),
        Ok(1)
    );
    for sql in [
        "CREATE VIEW v AS SELECT a FROM t ORDER BY a LIMIT 14",
        "CREATE VIEW v AS SELECT DISTINCT a FROM t",
        "CREATE VIEW v AS SELECT a FROM t GROUP BY a",
    ] {
        let err = view(sql).unwrap_err().to_string();
        assert!(
            err.contains("may not sort, group, limit or window"),
            "{sql}: {err}"
        );
    }
}

mod caches;
mod fences;
mod migrations;
mod plan_cache;
