//! A subquery or CTE that computes columns must be fenced (`fences`): the
//! planner copies an unfenced one's computed columns into every place that
//! reads them.

use super::*;

const UNFENCED: &str = "copy each computed column into every place that reads it";

#[test]
fn computed_columns_of_a_subquery_or_cte_need_a_fence() {
    for sql in [
        "SELECT s.c FROM (SELECT md5(a) AS c FROM t) s",
        "SELECT s.c FROM (SELECT md5(a) AS c FROM t LIMIT ALL) s",
        "SELECT s.total FROM (SELECT b, sum(a) AS total FROM t GROUP BY b) s WHERE s.total > 0",
        "SELECT s.c FROM t, LATERAL (SELECT t.a || 'x' AS c) s",
        "SELECT s.c FROM (SELECT a AS c FROM t UNION ALL SELECT md5(a) FROM u) s",
        "SELECT v.c FROM (VALUES (md5($1))) v(c)",
        "UPDATE t SET a = s.c FROM (SELECT a || 'x' AS c FROM u) s",
        "SELECT 1 FROM t WHERE EXISTS (SELECT 1 FROM (SELECT md5(a) AS c FROM u) s WHERE s.c = t.a)",
        "WITH c AS (SELECT md5(a) AS m FROM t) SELECT m FROM c",
        // Without RECURSIVE, a CTE's own name in its body is the table.
        "WITH t AS (SELECT md5(a) AS a FROM t) SELECT a FROM t",
        "WITH c AS NOT MATERIALIZED (SELECT md5(a) AS m FROM t) SELECT m FROM c",
    ] {
        refused(sql, UNFENCED);
    }
    refused(
        &format!("SELECT s.c FROM (SELECT '{}' AS c) s", "x".repeat(65)),
        UNFENCED,
    );
}

#[test]
fn fenced_or_cheap_subqueries_and_ctes_pass() {
    for sql in [
        "SELECT s.c FROM (SELECT md5(a) AS c FROM t OFFSET 0) s",
        "SELECT s.c FROM (SELECT md5(a) AS c FROM t ORDER BY a LIMIT 10) s",
        "SELECT s.total FROM (SELECT b, sum(a) AS total FROM t GROUP BY b OFFSET 0) s WHERE s.total > 0",
        "SELECT s.c FROM (SELECT a AS c FROM t UNION ALL SELECT md5(a) FROM u OFFSET 0) s",
        "SELECT s.c FROM (SELECT a AS c FROM t UNION ALL (SELECT md5(a) FROM u LIMIT 5)) s",
        "WITH c AS MATERIALIZED (SELECT md5(a) AS m FROM t) SELECT m FROM c",
        "WITH c AS (SELECT md5(a) AS m FROM t OFFSET 0) SELECT m FROM c",
        // Columns, stars, parameters, short literals and their casts copy cheaply.
        "SELECT s.a, s.p, s.k, s.n FROM (SELECT a, $1::text AS p, 'k' AS k, NULL::int AS n FROM t) s",
        "SELECT s.a FROM (SELECT * FROM t) s",
        "SELECT s.a FROM (SELECT a FROM t UNION ALL SELECT b FROM u) s",
        "WITH c AS (SELECT a, $1 AS p FROM t) SELECT a, p FROM c",
        // A VALUES of several rows is scanned, not merged.
        "SELECT v.c FROM (VALUES (md5($1)), (md5($2))) v(c)",
        // A CTE that reads itself is always stored.
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10) SELECT i FROM n",
    ] {
        allowed(sql);
    }
}

/// What the fence rests on, on the server the suite runs against: an
/// unfenced subquery's computed column is copied into each reference, and
/// `OFFSET 0` keeps it a query of its own, computed once per row.
#[tokio::test]
async fn postgres_plans_a_fenced_subquery_on_its_own() {
    let Some(url) = crate::db::test_support::postgres_url().await else {
        return;
    };
    use sqlx::{Connection, Row};
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("CREATE TABLE fenced (a text)")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut md5_calls = async |from: &str| -> usize {
        let sql =
            format!("EXPLAIN (VERBOSE, FORMAT JSON) SELECT s.c, s.c, s.c FROM {from} AS s WHERE s.c = 'x'");
        let plan: serde_json::Value = sqlx::query(&sql).fetch_one(&mut conn).await.unwrap().get(0);
        plan.to_string().matches("md5(").count()
    };
    let unfenced = md5_calls("(SELECT md5(a) AS c FROM fenced)").await;
    let fenced = md5_calls("(SELECT md5(a) AS c FROM fenced OFFSET 0)").await;
    let materialized =
        md5_calls("(WITH m AS MATERIALIZED (SELECT md5(a) AS c FROM fenced) SELECT c FROM m)").await;
    assert!(unfenced >= 4, "unfenced: {unfenced} copies of md5 in the plan");
    assert_eq!((fenced, materialized), (1, 1));
}
