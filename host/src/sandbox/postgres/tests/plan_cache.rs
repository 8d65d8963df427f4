//! Which statements a handler's session keeps prepared (see `plan_cache`).

use super::*;

fn kept(sql: &str) -> bool {
    let checked =
        super::super::super::nesting::on_guard_stack(|| check_run_time(sql, 1 << 20, &Catalog::default()));
    checked.unwrap_or_else(|e| panic!("{sql}: {e:?}")).keep_prepared
}

#[test]
fn a_statement_over_few_names_is_kept_and_anything_wider_is_not() {
    assert!(kept("INSERT INTO invoices (order_id) VALUES ($1)"));
    assert!(kept("INSERT INTO invoices (order_id) VALUES ($1), ($2), ($3)"));
    assert!(kept("SELECT a FROM t1, t2, t3 JOIN t4 ON true"));
    assert!(kept("UPDATE t SET a = u.a FROM u WHERE u.id = t.id"));
    assert!(kept(
        "SELECT a FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.id = t.id)"
    ));
    assert!(!kept("SELECT a FROM t1, t2, t3 JOIN t4 ON true JOIN t5 ON true"));
    assert!(!kept(
        "INSERT INTO t (a) SELECT t1.a FROM t1, t2 WHERE EXISTS (SELECT 1 FROM t3, t4)"
    ));
    // Regression (the review of the twenty-second read): sources other than
    // a name may each be 1,664 columns wide, and joins list them all.
    assert!(!kept("WITH c AS MATERIALIZED (SELECT a FROM t) SELECT a FROM c"));
    assert!(!kept(
        "SELECT 1 FROM (VALUES (1, 2)) v JOIN (VALUES (3, 4)) w ON true"
    ));
    assert!(!kept("SELECT a FROM (SELECT a FROM t OFFSET 0) s"));
    assert!(!kept("SELECT u FROM t, unnest($1::bigint[]) u"));
    assert!(!kept(
        "SELECT a FROM t WHERE EXISTS (SELECT 1 FROM (VALUES (1)) v WHERE v.column1 = t.a)"
    ));
    // And a long text: a plan holds each of its expressions.
    let long = format!(
        "SELECT a FROM t /* {} */",
        "x".repeat(crate::sandbox::postgres::plan_cache::MAX_KEPT_TEXT_BYTES)
    );
    assert!(!kept(&long));
}

/// Regression (the second review of the twenty-second read): a view's WHERE
/// was bounded only by the node count, and four references to a view with a
/// 1 MB CASE kept 88 MB in one plan.
#[test]
fn a_views_definition_is_short() {
    let arms: String = (0..600)
        .map(|i| format!(" WHEN t.c{} IS NULL THEN false", i % 50))
        .collect();
    let view = format!("CREATE VIEW vw AS SELECT t.a AS a FROM t WHERE CASE{arms} ELSE true END");
    assert!(view.len() > crate::sandbox::postgres::plan_cache::MAX_VIEW_TEXT_BYTES);
    let checked = super::super::super::nesting::on_guard_stack(|| {
        check(&view, Mode::Migration, 1 << 20, &Catalog::default())
    });
    match checked {
        Err(Refusal::Limit(m)) => assert!(m.contains("view's definition"), "{m}"),
        other => panic!("{other:?}"),
    }
}
