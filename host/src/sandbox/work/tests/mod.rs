use super::*;

/// Checks `sql` as the run-time guard does, with rows of `row_bytes`.
fn judged(sql: &str, row_bytes: u64) -> Result<(), Refusal> {
    crate::sandbox::nesting::on_guard_stack(|| {
        crate::sandbox::postgres::check(
            sql,
            crate::sandbox::postgres::Mode::RunTime,
            row_bytes,
            &Default::default(),
        )
        .map(drop)
    })
}

fn migration(sql: &str) -> Result<(), Refusal> {
    crate::sandbox::nesting::on_guard_stack(|| {
        crate::sandbox::postgres::check(
            sql,
            crate::sandbox::postgres::Mode::Migration,
            1 << 20,
            &Default::default(),
        )
        .map(drop)
    })
}

fn allowed(sql: &str) {
    assert_eq!(judged(sql, 1 << 20), Ok(()), "{sql}");
}

fn refused(sql: &str, because: &str) {
    refused_at(sql, 1 << 20, because);
}

fn refused_at(sql: &str, row_bytes: u64, because: &str) {
    match judged(sql, row_bytes) {
        Err(Refusal::Forbidden(m) | Refusal::Limit(m)) => {
            assert!(
                m.contains(because),
                "{sql}\n  refused with {m:?}, expected {because:?}"
            )
        }
        Ok(()) => panic!("allowed: {sql}"),
    }
}

/// What the guard says of a subquery or CTE that computes columns and is
/// not fenced (`sandbox::postgres::fences`).
const UNFENCED: &str = "copy each computed column into every place that reads it";

fn calls(call: &str, n: usize) -> String {
    format!("SELECT {} FROM t", vec![call; n].join(", "))
}

#[test]
fn ordinary_statements_fit_the_row_bound() {
    allowed(
        "INSERT INTO invoices (order_id, customer, amount_cents, event_id) VALUES ($1, $2, $3::bigint, $4) \
         ON CONFLICT (order_id) DO UPDATE SET amount_cents = invoices.amount_cents + excluded.amount_cents",
    );
    allowed("UPDATE accounts SET balance = balance + $1 WHERE id = $2 AND version = $3 RETURNING balance");
    allowed(
        "SELECT id, payload ->> 'kind', lower(email), md5(body) FROM docs \
         WHERE created > $1::timestamptz AND id = ANY($2::text[]) ORDER BY created DESC LIMIT 10",
    );
    allowed("INSERT INTO docs (id, body) VALUES ($1, $2::json)");
    allowed("SELECT price * quantity, round(price * $1::numeric(12, 4), 2) FROM lines WHERE order_id = $2");
    allowed(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) SELECT sum(i) FROM n",
    );
    allowed("SELECT * FROM unnest($1::text[], $2::bigint[]) AS u(id, n)");
    // Each row of VALUES is a block of its own.
    let rows: Vec<String> = (0..200)
        .map(|i| format!("(${}::bigint, ${}::text)", 2 * i + 1, 2 * i + 2))
        .collect();
    allowed(&format!("INSERT INTO t (a, b) VALUES {}", rows.join(", ")));
}

/// Regression (an adversarial read, issue 23): one row's calls over a large
/// value ran past every deadline, and `pg_terminate_backend` did not stop them.
#[test]
fn many_calls_over_one_row_are_refused_with_the_bound_named() {
    refused(&calls("md5(v)", 200), "limits.max_row_bytes = 1048576");
    refused(&calls("upper(v)", 40), "limits.max_row_bytes");
    refused(&calls("$1::json", 20), "ms on one row");
    // The same statement fits rows a team holds small.
    assert_eq!(judged(&calls("md5(v)", 200), 16 << 10), Ok(()));
    // In a WHERE clause, a join or a subquery alike.
    refused(
        &format!("SELECT 1 FROM t WHERE {}", vec!["md5(v) = $1"; 100].join(" AND ")),
        "limits.max_row_bytes",
    );
    refused(
        &format!(
            "SELECT 1 WHERE EXISTS (SELECT {} FROM t)",
            vec!["md5(v)"; 200].join(", ")
        ),
        "limits.max_row_bytes",
    );
}

#[test]
fn values_that_grow_through_derived_tables_are_counted_at_their_size() {
    // Each level doubles the value its outer level hashes.
    // Fenced, so read as values, not copied: still their size.
    let chain = |fence: &str| {
        let mut sql = "SELECT v FROM t".to_owned();
        for _ in 0..12 {
            sql = format!("SELECT v || v AS v FROM ({sql}{fence}) s");
        }
        format!("SELECT md5(v) FROM ({sql}{fence}) s")
    };
    refused(&chain(" OFFSET 0"), "limits.max_row_bytes");
    refused(&chain(""), UNFENCED);
    let mut ctes = vec!["a0 AS (SELECT v FROM t)".to_owned()];
    for i in 1..12 {
        ctes.push(format!(
            "a{i} AS MATERIALIZED (SELECT v || v AS v FROM a{})",
            i - 1
        ));
    }
    refused(
        &format!("WITH {} SELECT md5(v) FROM a11", ctes.join(", ")),
        "limits.max_row_bytes",
    );
    refused(
        "WITH RECURSIVE r(v, i) AS (SELECT $1::text, 0 UNION ALL SELECT v || v, i + 1 FROM r WHERE i < 30) \
         SELECT md5(v) FROM r",
        "limits.max_row_bytes",
    );
    refused(
        "WITH RECURSIVE r(v, i) AS (SELECT $1::text, 0 UNION ALL SELECT ROW(v, v)::text, i + 1 FROM r \
         WHERE i < 30) SELECT count(*) FROM r",
        "limits.max_row_bytes",
    );
}

#[test]
fn unbounded_numerics_are_refused() {
    refused("SELECT $1::numeric * $2::numeric FROM t", "numeric(p, s)");
    refused("SELECT CAST(v AS decimal) FROM t", "numeric(p, s)");
    assert!(
        matches!(migration("CREATE TABLE t (a numeric)"), Err(Refusal::Forbidden(m)) if m.contains("numeric(p, s)"))
    );
    assert_eq!(
        migration("CREATE TABLE t (a numeric(12, 2), b decimal(1000, 0))"),
        Ok(())
    );
    // Two operations on literals of 60,000 digits: 1.4 s by the weights,
    // and since the eighteenth adversarial read no literal has more digits
    // than a numeric column.
    let big = "9".repeat(60_000);
    refused(&format!("SELECT {big} * {big} / {big}"), "more than 1000 digits");
    refused("SELECT power(2.0, 100000)", "power");
    refused("SELECT 2.0 ^ 100000", "operator ^");
}

#[test]
fn arrays_stand_only_where_each_element_is_visited_once() {
    refused("SELECT doc - $1::text[] FROM t", "an array is allowed only");
    refused("SELECT doc - ARRAY['a', 'b'] FROM t", "an array is allowed only");
    refused(
        "SELECT doc - x FROM t, (SELECT $1::text[] AS x) s",
        "an array is allowed only",
    );
    refused(
        "SELECT id FROM t WHERE id = ANY(ARRAY(SELECT id FROM t))",
        "ARRAY(subquery)",
    );
    allowed("SELECT id FROM t WHERE id <> ALL(ARRAY[$1, $2]) AND id = ANY($3::bigint[])");
    allowed("SELECT u.id FROM unnest(ARRAY[$1::text, $2::text]) AS u(id)");
    assert!(
        matches!(migration("CREATE TABLE t (tags text[])"), Err(Refusal::Forbidden(m)) if m.contains("array"))
    );
}

#[test]
fn a_views_expressions_are_refused_and_its_columns_allowed() {
    assert_eq!(migration("CREATE VIEW v AS SELECT a, b AS c FROM t"), Ok(()));
    assert_eq!(
        migration("CREATE VIEW v AS SELECT t.*, u.b FROM t JOIN u ON u.a = t.a WHERE t.a > 0"),
        Ok(())
    );
    for view in [
        "CREATE VIEW v AS SELECT md5(a) AS h FROM t",
        "CREATE VIEW v AS SELECT a || a AS aa FROM t",
        "CREATE VIEW v AS SELECT a::text AS a FROM t",
    ] {
        assert!(
            matches!(migration(view), Err(Refusal::Forbidden(m)) if m.contains("a view on PostgreSQL")),
            "{view}"
        );
    }
}

#[test]
fn the_hosts_row_bound_cannot_be_dropped_renamed_or_squatted() {
    for sql in [
        "ALTER TABLE t DROP CONSTRAINT inboxd_row_bound",
        "ALTER TABLE t DROP CONSTRAINT IF EXISTS inboxd_row_bound",
        "ALTER TABLE t RENAME CONSTRAINT inboxd_row_bound TO mine",
        "ALTER TABLE t RENAME CONSTRAINT mine TO inboxd_row_bound",
        "ALTER TABLE t ADD CONSTRAINT inboxd_row_bound CHECK (true)",
        "CREATE TABLE t (a bigint CONSTRAINT inboxd_row_bound CHECK (a > 0))",
    ] {
        assert!(
            matches!(migration(sql), Err(Refusal::Forbidden(m)) if m.contains("kept for the host")),
            "{sql}"
        );
    }
    assert_eq!(migration("ALTER TABLE t DROP CONSTRAINT t_a_check"), Ok(()));
}

/// Regression (an adversarial read, issue 23): the planner pulls a subquery
/// up into the query that reads it, copying a derived column's expression
/// to every place it is named; bounding each query on its own let 29^3
/// copies of 60 md5 calls through.
#[test]
fn a_derived_column_costs_its_expression_at_every_reference() {
    let leaf = format!(
        "SELECT greatest(t.v, {}) AS v FROM t WHERE t.id = $1",
        vec!["md5(t.v)"; 60].join(", ")
    );
    let mut sql = leaf;
    for level in 1..4 {
        let refs = vec![format!("x{level}.v"); 29].join(", ");
        sql = format!("SELECT greatest({refs}) AS v FROM ({sql}) x{level}");
    }
    // Now refused before it is counted: such a subquery must be fenced.
    refused(&format!("SELECT md5(x4.v) FROM ({sql}) x4"), UNFENCED);
    // One CTE read once is inlined the same way.
    refused(
        &format!(
            "WITH c AS (SELECT {} AS h FROM t) SELECT {} FROM c",
            vec!["md5(v)"; 40].join(" || "),
            ["c.h"; 3].join(", ")
        ),
        UNFENCED,
    );
    // A subquery's cheap columns stay cheap to name.
    allowed("SELECT s.a, s.b, s.a FROM (SELECT a, b FROM t WHERE a = $1) s WHERE s.b > 0");
}

/// Regression (an adversarial read, issue 23): `1e65000` was sized by its
/// seven characters, not its 65,001 digits.
#[test]
fn a_numeric_literal_counts_the_digits_its_exponent_adds() {
    // Now refused as literals past a numeric column's digits, before the
    // work is counted.
    let products = ["(1e65000/7)*(1e65000/7)"; 3].join(", ");
    refused(&format!("SELECT {products}"), "more than 1000 digits");
    refused(
        &format!("SELECT md5(concat({}))", vec!["1e131000"; 700].join(", ")),
        "more than 1000 digits",
    );
    // Digits a CTE computes reach its readers.
    let nines = "9".repeat(60_000);
    refused(
        &format!("WITH c(n) AS MATERIALIZED (SELECT {nines}) SELECT c.n * c.n, c.n * c.n FROM c"),
        "more than 1000 digits",
    );
    allowed("SELECT 1.5e3 * amount, 2e-2 FROM t");
}

/// Regression (an adversarial read, issue 23): a function in FROM returned
/// values as large as its arguments (841 MiB through two `unnest`s), which
/// the guard then counted as stored ones.
#[test]
fn a_function_in_from_passes_its_arguments_size_to_its_columns() {
    let concat = |x: &str| format!("concat({})", vec![x; 29].join(", "));
    let inner = format!("SELECT u.v FROM unnest(ARRAY[{}]) AS u(v)", concat("$1"));
    let sql = format!(
        "SELECT {} FROM (SELECT w.v FROM ({inner}) a, unnest(ARRAY[{}]) AS w(v)) b",
        vec!["md5(b.v)"; 79].join(", "),
        concat("a.v")
    );
    refused(&sql, "limits.max_row_bytes");
}

#[test]
fn a_column_collation_is_refused() {
    assert!(matches!(
        migration("CREATE TABLE t (v text COLLATE \"und-x-icu\")"),
        Err(Refusal::Forbidden(m)) if m.contains("COLLATE")
    ));
}

/// Regression (an adversarial read, issue 23): a whole row of a derived
/// table of 1,000 parameters was counted as one value, and was a gigabyte.
#[test]
fn a_whole_row_stands_only_as_a_select_item() {
    let columns = |n: usize| (1..=n).map(|i| format!("$1 c{i}")).collect::<Vec<_>>().join(", ");
    let derived = format!("(SELECT {}) s", columns(10));
    refused(&format!("SELECT md5(s::text) FROM {derived}"), "a whole row");
    refused(&format!("SELECT md5(s.*::text) FROM {derived}"), "a whole row");
    refused("SELECT ROW(t.*) FROM t", "a whole row");
    // A gigabyte row is refused whether or not it is named whole.
    refused(
        &format!("SELECT * FROM (SELECT {}) s", columns(1000)),
        "limits.max_row_bytes",
    );
    allowed("SELECT * FROM t WHERE a = $1");
    allowed("SELECT t.*, u.b FROM t JOIN u ON u.a = t.a");
    allowed("INSERT INTO t (a, b) VALUES ($1, $2) RETURNING *");
    // A function in FROM passes its arguments' size on to its columns.
    let rows = vec!["$1"; 31].join(", ");
    refused(
        &format!(
            "SELECT md5(w.v) FROM unnest(ARRAY[concat({rows})]) u(v), unnest(ARRAY[concat(u.v, u.v)]) w(v)"
        ),
        "limits.max_row_bytes",
    );
}

#[test]
fn index_methods_exclusions_and_virtual_columns_the_guard_cannot_count_are_refused() {
    for (sql, because) in [
        ("CREATE INDEX g ON docs USING gin (body)", "USING gin"),
        ("CREATE INDEX p ON docs (id) WHERE id > 0", "partial index"),
        (
            "CREATE UNIQUE INDEX p ON docs (id) WHERE body IS NOT NULL",
            "partial index",
        ),
        (
            "CREATE TABLE r (a bigint, EXCLUDE USING btree (a WITH =))",
            "EXCLUDE",
        ),
        (
            "CREATE TABLE r (a bigint, b bigint GENERATED ALWAYS AS (a * 2) VIRTUAL)",
            "STORED",
        ),
    ] {
        assert!(
            matches!(migration(sql), Err(Refusal::Forbidden(m)) if m.contains(because)),
            "{sql}"
        );
    }
    assert_eq!(
        migration("CREATE TABLE r (a bigint, b bigint GENERATED ALWAYS AS (a * 2) STORED)"),
        Ok(())
    );
    assert_eq!(migration("CREATE INDEX h ON docs USING hash (id)"), Ok(()));
    assert_eq!(migration("CREATE UNIQUE INDEX b ON docs (id)"), Ok(()));
}

/// Regression (an adversarial read, issue 23): ordinary statements with a
/// computed column in a subquery or CTE were refused, every column being
/// counted at the largest derived value and the rounds never settling; and
/// a column named like its table was taken for a whole row.
#[test]
fn ordinary_subqueries_ctes_and_names_pass() {
    for sql in [
        "SELECT c.name, t.total FROM customers c JOIN (SELECT customer_id, sum(amount) AS total FROM orders \
         GROUP BY 1 OFFSET 0) t ON t.customer_id = c.id",
        "UPDATE accounts SET balance = (SELECT coalesce(sum(amount), 0) FROM entries WHERE account_id = $1) \
         WHERE id = $1",
        "WITH l AS MATERIALIZED (SELECT order_id, qty * price AS amt FROM lines) SELECT order_id FROM l \
         WHERE amt > $1",
        // (`created::date`, a column cast to a date, is refused since the
        // forty-second read: a column may hold text naming time zones.)
        "SELECT * FROM (SELECT id, date_trunc('day', created)::date AS d FROM events OFFSET 0) e \
         WHERE d = $1::date",
        "SELECT x.n, y.m FROM (SELECT lower(name) AS n FROM a OFFSET 0) x, (SELECT upper(name) AS m FROM b \
         OFFSET 0) y WHERE x.n = y.m",
        "UPDATE balance SET balance = balance + $1 WHERE account = $2",
        "SELECT tag FROM tag",
        "INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT (a) DO UPDATE SET b = excluded.b",
        "SELECT a.x, b.y, c.z FROM a JOIN b ON b.id = a.id JOIN c ON c.id = b.id WHERE a.k = $1 AND b.k = $2 \
         AND c.k = $3 AND a.s = $4 AND b.s = $5 AND c.s = $6 AND a.t = $7 AND b.t = $8 AND c.t = $9 AND a.u = $10",
    ] {
        allowed(sql);
    }
}

/// Regression (an adversarial read, issue 23): `char(n)` pads to n, and
/// `concat_ws` writes its separator between every two arguments: a gigabyte
/// from a few characters.
#[test]
fn padding_and_separators_count_at_their_size() {
    let empties = vec!["''"; 98].join(", ");
    refused(
        &format!("SELECT md5(concat_ws(concat('a'::char(10485760)), {empties}))"),
        "at most char(256)",
    );
    refused(
        &format!("SELECT md5(concat_ws(concat_ws($1, {empties}), {empties}))"),
        "limits.max_row_bytes",
    );
    // A recursive CTE's `x + x` may double a number at every step.
    refused(
        &format!(
            "WITH RECURSIVE r(x, n) AS (SELECT 1.5, 0 UNION ALL SELECT x + x, n + 1 FROM r WHERE n < 210000) \
             SELECT {} FROM r WHERE n = 210000",
            ["x * x"; 3].join(", ")
        ),
        "limits.max_row_bytes",
    );
    allowed(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) SELECT sum(i) FROM n",
    );
}

/// Regression (an adversarial read, issue 23): outputs PostgreSQL names
/// itself (`?column?`, `case`) and columns renamed where they are read were
/// looked up as stored values, with no work: a CASE chain of CTEs doubled
/// its md5 calls at every level, and `||` chains built 128 MiB unseen.
#[test]
fn outputs_without_a_name_and_renames_on_reading_still_count() {
    let mut ctes = vec![
        "l0 AS (SELECT CASE WHEN $1::text IS NOT NULL THEN md5($1::text) END FROM t WHERE id = $2)"
            .to_owned(),
    ];
    for i in 1..14 {
        ctes.push(format!(
            "l{i} AS (SELECT CASE WHEN \"case\" IS NOT NULL THEN \"case\" END FROM l{})",
            i - 1
        ));
    }
    refused(
        &format!("WITH {} SELECT \"case\" FROM l13", ctes.join(", ")),
        UNFENCED,
    );
    // Stored, so read as values: still their size.
    let mut ctes = vec!["l1 AS MATERIALIZED (SELECT body || body FROM t WHERE id = $1)".to_owned()];
    for i in 2..8 {
        ctes.push(format!(
            "l{i} AS MATERIALIZED (SELECT \"?column?\" || \"?column?\" FROM l{})",
            i - 1
        ));
    }
    refused(
        &format!("WITH {} SELECT \"?column?\" FROM l7", ctes.join(", ")),
        "limits.max_row_bytes",
    );
    let mut ctes = vec!["l1 AS MATERIALIZED (SELECT body || body AS v FROM t WHERE id = $1)".to_owned()];
    for i in 2..8 {
        ctes.push(format!(
            "l{i} AS MATERIALIZED (SELECT w || w AS v FROM l{} AS p(w))",
            i - 1
        ));
    }
    refused(
        &format!("WITH {} SELECT v FROM l7", ctes.join(", ")),
        "limits.max_row_bytes",
    );
    // A derived column named like a table's is not thereby small.
    refused(
        &format!(
            "WITH d AS (SELECT 1 AS body) SELECT {} FROM t, d",
            vec!["md5(t.body)"; 100].join(", ")
        ),
        "limits.max_row_bytes",
    );
}

/// Regression (the fifth adversarial read, issue 23): `x op ANY/ALL (array)`
/// and GREATEST/LEAST run their operator once per element or argument, each
/// time over all of `x`; they were counted as one operator over both sides.
#[test]
fn an_operator_over_each_element_counts_once_per_element() {
    refused("SELECT v > ALL ($1::text[]) FROM t", "ANY/ALL (array) is allowed");
    refused("SELECT $1 > ALL ($2::text[])", "ANY/ALL (array) is allowed");
    refused(
        "SELECT doc < ANY ($1::text[]) FROM t",
        "ANY/ALL (array) is allowed",
    );
    // A bare parameter's type is x's (jsonb's `=` walks x per element).
    refused(
        "SELECT id FROM t WHERE doc = ANY ($1)",
        "ANY/ALL (array) is allowed",
    );
    refused(
        "SELECT id FROM t WHERE doc = ANY ($1::json[])",
        "ANY/ALL (array) is allowed",
    );
    refused(
        "SELECT id FROM t WHERE code = ANY ($1::bpchar[])",
        "ANY/ALL (array) is allowed",
    );
    allowed("SELECT id FROM t WHERE id = ANY ($1::bigint[]) AND name <> ALL ($2::text[])");
    // The forty-second read: each element's text may name a time zone,
    // parsed inside the one cast (61,680 POSIX rules: 6.5 s past a 5 s
    // timeout, 1.47 GB kept by the session).
    for zoned in ["timestamptz", "timestamp", "date"] {
        refused(
            &format!("SELECT 1 WHERE now() = ANY (CAST($1 AS {zoned}[]))"),
            "ANY/ALL (array) is allowed",
        );
    }
    allowed("SELECT id FROM t WHERE v > ALL (ARRAY[$1, $2])");
    // An ARRAY[...] of many elements costs x once per element.
    let many = vec!["'0'"; 2_000].join(", ");
    refused(
        &format!("SELECT v > ALL (ARRAY[{many}]) FROM t"),
        "limits.max_row_bytes",
    );
    let args = vec!["'0'"; 7_000].join(", ");
    refused(
        &format!("SELECT length(greatest(v, {args})) FROM t"),
        "limits.max_row_bytes",
    );
    allowed("SELECT greatest(a, b, c), least($1, $2) FROM t");
}

/// Regression (the fifth adversarial read, issue 23): the planner folds an
/// expression of literals in every row of a VALUES list while planning,
/// without an interrupt check, so those rows' work adds up; what depends on
/// a parameter is evaluated row by row (guests' sessions plan generically).
#[test]
fn a_values_lists_literal_rows_add_up_and_its_parameter_rows_do_not() {
    let work = |sql: &str| crate::sandbox::postgres::row_work_ns(sql, 1 << 20).unwrap();
    let literal = format!("(md5('{}'))", "x".repeat(1_000));
    let literals = |n| {
        format!(
            "SELECT h FROM (VALUES {}) v(h)",
            vec![literal.as_str(); n].join(", ")
        )
    };
    // (The reader's reference to `h` costs one row's expression again.)
    assert!(
        work(&literals(100)) >= 45 * work(&literals(1)),
        "literal rows sum"
    );
    let params = |n| format!("SELECT h FROM (VALUES {}) v(h)", vec!["(md5($1))"; n].join(", "));
    assert_eq!(work(&params(100)), work(&params(1)), "parameter rows count once");
}

/// Regression (the sixth adversarial read, issue 23): reading an object
/// into jsonb sorts its keys without an interrupt check, quadratic for a
/// crafted order (131,000 keys: 39.5 s), and `to_timestamp`'s format fields
/// each scan the rest of its input (1 MiB of each: minutes).
#[test]
fn json_reads_only_what_the_host_counted_and_formats_stay_short() {
    allowed("INSERT INTO docs (id, body) VALUES ($1, $2::json)");
    allowed("SELECT CAST($1 AS json) ->> 'a', '{\"a\": 1}'::json -> 'a'");
    allowed("SELECT body -> 'a', body ->> 'b' FROM docs");
    for sql in [
        "SELECT v::json FROM t",
        "SELECT CAST(v AS json) FROM t",
        "SELECT (v || $1)::json FROM t",
        "UPDATE docs SET body = (SELECT v FROM t)::json",
    ] {
        refused(
            sql,
            "a cast to json or jsonb may take only a parameter or a literal",
        );
    }
    let keys: Vec<String> = (0..7_000).map(|i| format!("\"k{i}\": 0")).collect();
    refused(
        &format!("SELECT '{{{}}}'::json", keys.join(", ")),
        "too many keys",
    );
    // Each cast of a checked value still costs its sort.
    refused(&calls("$1::json", 11), "limits.max_row_bytes");
    assert!(migration("CREATE TABLE j (t text, b jsonb GENERATED ALWAYS AS (t::jsonb) STORED)").is_err());

    // The seventh read: json_object('{k1,0,...}') takes its keys from an array's text.
    refused(
        "INSERT INTO docs (body) SELECT json_object('{a,0,b,0}')",
        "json_build_object",
    );

    allowed("SELECT to_timestamp($1, 'YYYY-MM-DD HH24:MI:SS'), to_timestamp($2::float8)");
    refused("SELECT to_timestamp($1, $2)", "needs a literal format");
    // The thirteenth read: to_char's format fields each work over all of a
    // numeric's (up to 131,001) digits.
    allowed("SELECT to_char(amount, 'FM999G999D00'), to_char(now(), 'YYYY-MM-DD') FROM t");
    refused(
        "SELECT to_char(1.0, $1)",
        "to_char(x, format) needs a literal format",
    );
    refused(
        &format!("SELECT to_char(1.0, '9V{}')", "9".repeat(100)),
        "to_char(x, format) needs a literal format",
    );
    refused(
        &format!("SELECT to_timestamp($1, '{}')", "HH".repeat(40)),
        "needs a literal format",
    );
}

/// Regression (the seventeenth adversarial read, issue 23): the guard walks
/// the tree once per query to carry derived values along; 2,000 LATERAL
/// subqueries each reading the one before took minutes of its time. A
/// statement holds at most `MAX_QUERIES` queries.
#[test]
fn a_statement_holds_a_bounded_number_of_queries() {
    let chain = |n: usize| {
        let mut sql = "SELECT 1 FROM (SELECT CAST(1 AS numeric(10, 0)) AS x0) AS c0".to_owned();
        for i in 1..n {
            sql.push_str(&format!(
                ", LATERAL (SELECT c{}.x{} AS x{i}) AS c{i}",
                i - 1,
                i - 1
            ));
        }
        sql
    };
    let limit = super::MAX_QUERIES as usize;
    // The outer SELECT is one query too.
    assert!(judged(&chain(limit - 1), 1 << 20).is_ok());
    refused_at(&chain(limit + 1), 1 << 20, "queries");
    let started = std::time::Instant::now();
    // As long a chain as the token bound lets through (`MAX_TOKENS`).
    refused_at(&chain(1_300), 1 << 20, "queries");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Regression (the seventeenth adversarial read, issue 23): a chain of
/// data-modifying CTEs, each RETURNING three copies of the one before,
/// counted as no query, so the rounds that carry derived values stopped
/// short and the guard saw 27 copies of a value where there were 3^10.
#[test]
fn returning_chains_are_carried_to_their_end() {
    let mut ctes = vec!["a0 AS (DELETE FROM docs WHERE id = 0 RETURNING body AS y)".to_owned()];
    for k in 1..=10 {
        ctes.push(format!(
            "a{k} AS (DELETE FROM docs USING a{p} WHERE docs.id = {k} RETURNING concat(a{p}.y, a{p}.y, a{p}.y) AS y)",
            p = k - 1
        ));
    }
    let sql = format!("WITH {} SELECT length(y) FROM a10", ctes.join(", "));
    assert!(judged(&sql, 1 << 20).is_err(), "{sql}");
}
mod copies;
mod parse_bounds;

/// Regression (the twenty-sixth adversarial read, issue 23): `round(x, s)`
/// gives x the scale s, and the model took `round(1.0, 1000) / 3` for 20
/// digits; sixteen of them multiplied and then squared 3,900 times (the
/// read's statement, 18.6 KB at `max_row_bytes` = 1024) were counted at
/// 0.99 s and would run about 90 s in one row. Now a literal scale adds its
/// digits and any other scale PostgreSQL's largest.
#[test]
fn rounding_to_a_scale_counts_the_digits_it_makes() {
    let attack = include_str!("round_scale_attack.sql");
    refused_at(attack, 1024, "");
    let one = crate::sandbox::postgres::row_work_ns(
        "SELECT round(1.0, 1000) / 3 * (round(1.0, 1000) / 3) = 0",
        1 << 20,
    )
    .unwrap();
    let two =
        crate::sandbox::postgres::row_work_ns("SELECT round(1.0, 2) / 3 * (round(1.0, 2) / 3) = 0", 1 << 20)
            .unwrap();
    // A product of two 1,000-digit numbers: (1,000 / 4)² digit-group pairs.
    assert!(
        one > 150_000 && one > 20 * two,
        "1,000 digits each ({one} ns) against 2 ({two} ns)"
    );
    // A scale that is no literal counts as PostgreSQL's largest.
    let param =
        crate::sandbox::postgres::row_work_ns("SELECT round(1.0, $1) * round(1.0, $1) = 0", 1 << 20).unwrap();
    assert!(param > one, "{param} ns");
    // What handlers write still passes.
    allowed("SELECT round(amount_cents / 100.0, 2) FROM invoices WHERE id = $1");
}

/// Regression (the twenty-seventh adversarial read, issue 23): as text a
/// row quotes each item and doubles its `"`s, so nested rows double at
/// every level (a 1 MiB parameter eight rows deep: 256 MiB in one
/// expression, 2.6 s against a 200 ms timeout, counted as 1 MiB); and
/// `mod(x, y)` keeps x's digits, and a sum of a long number and another
/// keeps one's integer digits and the other's fraction.
#[test]
fn rows_as_text_and_remainders_count_what_they_make() {
    let mut nested = "$1".to_owned();
    for _ in 0..8 {
        nested = format!("({nested}, '')");
    }
    refused_at(&format!("SELECT concat({nested})"), 1 << 20, "");
    // A row as a value is refused outright since the forty-second read
    // (`sandbox::postgres::rows`): a session keeps its record type for good.
    refused(
        "SELECT concat(($1, $2)) FROM invoices WHERE id = $3",
        "row constructor",
    );
    let remainder = |of: &str| {
        crate::sandbox::postgres::row_work_ns(&format!("SELECT {of} * {of} = 0"), 1 << 20).unwrap()
    };
    let long = remainder("mod(round(1.0, 1000) / 3, 7)");
    let short = remainder("mod(10, 7)");
    // (1,040 / 4)² digit-group pairs for the product.
    assert!(
        long > 150_000 && long > 20 * short,
        "mod keeps x's digits: {long} ns against {short} ns"
    );
    let summed = remainder("round(1.0, 1000) + 1e999");
    let single = remainder("round(1.0, 1000)");
    assert!(10 * summed > 13 * single, "{summed} ns against {single} ns");
}
