//! Which statements a handler's session keeps prepared (see `plan_cache`).

use super::*;

fn kept(sql: &str) -> bool {
    let checked =
        super::super::super::nesting::on_guard_stack(|| check_run_time(sql, 1 << 20, &Catalog::default()));
    checked.unwrap_or_else(|e| panic!("{sql}: {e:?}")).keep_prepared
}

#[test]
fn a_statement_naming_few_relations_is_kept_and_a_wide_join_is_not() {
    assert!(kept("INSERT INTO invoices (order_id) VALUES ($1)"));
    assert!(kept("SELECT a FROM t1, t2, t3 JOIN t4 ON true"));
    assert!(kept("UPDATE t SET a = u.a FROM u WHERE u.id = t.id"));
    assert!(!kept("SELECT a FROM t1, t2, t3 JOIN t4 ON true JOIN t5 ON true"));
    // Wherever the names stand: subqueries, CTEs, the target of a write.
    assert!(!kept(
        "WITH c AS MATERIALIZED (SELECT a FROM t1, t2) SELECT a FROM c WHERE EXISTS (SELECT 1 FROM t3, t4)"
    ));
    assert!(!kept(
        "INSERT INTO t (a) SELECT t1.a FROM t1, t2, (SELECT a FROM t3 OFFSET 0) s, t4"
    ));
}
