//! What one migration statement may make or set (`ddl_bounds`).

use super::*;

/// Regression (the review of the nineteenth adversarial read, issue 23): one
/// statement's indexes and foreign keys are locked before the host counts a
/// migration's locks.
#[test]
fn a_migration_statement_makes_a_bounded_number_of_keys() {
    let table = |n: usize| {
        let columns = (0..n).map(|i| format!("c{i} text UNIQUE")).collect::<Vec<_>>();
        format!("CREATE TABLE x (id bigint PRIMARY KEY, {})", columns.join(", "))
    };
    let migration = |sql: &str| check(sql, Mode::Migration, 1 << 20, &Catalog::default());
    assert_eq!(migration(&table(31)), Ok(1));
    for sql in [
        table(32),
        table(1_600),
        format!(
            "ALTER TABLE t {}",
            (0..33)
                .map(|i| format!("ADD CONSTRAINT k{i} FOREIGN KEY (a) REFERENCES u (a)"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ] {
        let err = migration(&sql).unwrap_err().to_string();
        assert!(err.contains("at most 32 in one statement"), "{err}");
    }
}

/// Regression (the twenty-first adversarial read, issue 23): statistics
/// targets and storage parameters, and identity columns (a sequence each).
#[test]
fn a_migration_sets_no_planner_or_storage_parameters() {
    let migration = |sql: &str| check(sql, Mode::Migration, 1 << 20, &Catalog::default());
    for sql in [
        "ALTER TABLE t ALTER COLUMN a SET STATISTICS 10000",
        "ALTER TABLE t ALTER COLUMN a SET (n_distinct = 1)",
        "ALTER TABLE t SET (autovacuum_enabled = false)",
        "CREATE TABLE z (a text) WITH (autovacuum_enabled = false)",
        "CREATE INDEX zi ON t (a) WITH (fillfactor = 10)",
    ] {
        let err = migration(sql).unwrap_err().to_string();
        assert!(err.contains("storage parameters"), "{sql}: {err}");
    }
    let identities = (0..33)
        .map(|i| format!("c{i} bigint GENERATED ALWAYS AS IDENTITY"))
        .collect::<Vec<_>>();
    let err = migration(&format!("CREATE TABLE z ({})", identities.join(", ")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("identity"), "{err}");
    assert_eq!(
        migration("CREATE TABLE z (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY)"),
        Ok(1)
    );
}
