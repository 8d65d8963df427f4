//! Every transition of the walls' state machine, on a real SQLite and (when
//! `INBOXD_TEST_POSTGRES` is set) PostgreSQL, asserting what a user sees:
//! whose rows survive, and what a statement inside or outside the walls can reach.

use super::{HOST_SEARCH_PATH, PG_LEAVE, Walls};
use crate::db::inbox::{self, Claim};
use crate::db::migrate::{self, Migration};
use crate::db::test_support::{each_backend, sqlite_db};
use crate::db::{Backend, Database, DbError, SqlValue, Tx};
use crate::sandbox::authorizer::Scope;
use std::time::Duration;

mod abandoned;
mod handler_sessions;
mod held_back;
mod row_work;
mod sqlite_memory;

/// The pipeline's savepoint name for a guest call; replay uses another.
const CALL: &str = "inboxd_guest";
const OTHER_CALL: &str = "inboxd_replay";

/// A handler with one table of its own, `<name>_t (a INTEGER)`, made by its
/// migration as an upload makes it; returns its run-time walls.
async fn handler(db: &Database, name: &str) -> Walls {
    migrate::prepare_handler(db, name).await.unwrap();
    let sql = format!("CREATE TABLE {name}_t (a INTEGER);");
    let migration = Migration::new("0001_init.sql", sql).unwrap();
    let mut tx = db.begin_migration(name).await.unwrap();
    assert!(migrate::apply_one(&mut tx, name, &migration).await.unwrap());
    tx.commit().await.unwrap();
    Walls::load(db, name, Duration::from_secs(5)).await.unwrap()
}

/// The handler's table as host SQL names it (schema-qualified on PostgreSQL).
fn table(db: &Database, walls: &Walls) -> String {
    db.handler_table(walls.handler(), &format!("{}_t", walls.handler()))
}

/// The host's inbox, qualified as a guest would have to try to reach it.
fn host_inbox(tx: &Tx) -> &'static str {
    match tx.backend() {
        Backend::Sqlite => "main.inbox",
        Backend::Postgres => "inboxd.inbox",
    }
}

/// A host statement: the claim of one event (an inbox row).
async fn claim(tx: &mut Tx, handler: &str, event_id: &str) -> Result<bool, DbError> {
    let claim = Claim {
        handler,
        event_id,
        topic: "topic",
        partition: 0,
        offset: 0,
        handler_version: "1",
    };
    inbox::claim(tx, &claim).await
}

/// A guest statement of `walls`' handler: one row into its own table.
async fn guest_insert(tx: &mut Tx, walls: &Walls, a: i64) -> Result<u64, DbError> {
    let sql = format!("INSERT INTO {}_t (a) VALUES ($1)", walls.handler());
    tx.guest_execute(&sql, &[a.into()]).await
}

/// The values in the handler's table, in order.
async fn rows(db: &Database, walls: &Walls) -> Vec<i64> {
    let sql = format!("SELECT a FROM {} ORDER BY a", table(db, walls));
    let rows = db.query(&sql, &[]).await.unwrap();
    rows.iter().map(|r| r[0].as_i64().expect("an integer")).collect()
}

/// The event ids in the inbox, in order.
async fn claims(db: &Database) -> Vec<String> {
    let rows = db
        .query("SELECT event_id FROM inbox ORDER BY event_id", &[])
        .await
        .unwrap();
    rows.iter()
        .map(|r| r[0].as_str().expect("an event id").to_owned())
        .collect()
}

#[tokio::test]
async fn a_failed_call_is_undone_and_the_claim_survives() {
    for db in each_backend().await {
        let h = handler(&db, "wt_failed").await;
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        assert!(claim(&mut tx, "wt_failed", "e1").await.unwrap());
        tx.enter_guest(CALL, &h).await.unwrap();
        guest_insert(&mut tx, &h, 1).await.unwrap();
        tx.exit_guest(CALL, false).await.unwrap();
        // Out of the walls at once: the host writes its own table.
        assert!(claim(&mut tx, "wt_failed", "e2").await.unwrap());
        tx.commit().await.unwrap();
        assert_eq!(rows(&db, &h).await, Vec::<i64>::new(), "{:?}", db.backend());
        assert_eq!(claims(&db).await, ["e1", "e2"]);
    }
}

#[tokio::test]
async fn a_successful_call_keeps_its_rows_through_commit() {
    for db in each_backend().await {
        let h = handler(&db, "wt_ok").await;
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        assert!(claim(&mut tx, "wt_ok", "e1").await.unwrap());
        tx.enter_guest(CALL, &h).await.unwrap();
        guest_insert(&mut tx, &h, 1).await.unwrap();
        tx.exit_guest(CALL, true).await.unwrap();
        // Committed while the call lingers in its walls.
        tx.commit().await.unwrap();
        assert_eq!(rows(&db, &h).await, [1], "{:?}", db.backend());
        assert_eq!(claims(&db).await, ["e1"]);
    }
}

#[tokio::test]
async fn inside_the_walls_no_host_table_can_be_touched() {
    for db in each_backend().await {
        let h = handler(&db, "wt_inside").await;
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        assert!(claim(&mut tx, "wt_inside", "e1").await.unwrap());
        tx.enter_guest(CALL, &h).await.unwrap();
        let qualified = host_inbox(&tx);
        for sql in [
            "DELETE FROM inbox".to_owned(),
            format!("DELETE FROM {qualified}"),
            format!("UPDATE {qualified} SET status = 'dead'"),
            "DELETE FROM offsets".to_owned(),
        ] {
            let refused = tx.guest_execute(&sql, &[]).await;
            assert!(refused.is_err(), "{:?}: {sql} ran", db.backend());
        }
        let read = tx
            .guest_query(&format!("SELECT * FROM {qualified}"), &[], 10, 1 << 20)
            .await;
        assert!(read.is_err(), "{:?}: the guest read the inbox", db.backend());
        guest_insert(&mut tx, &h, 1).await.unwrap();
        tx.exit_guest(CALL, true).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(claims(&db).await, ["e1"], "{:?}", db.backend());
        assert_eq!(rows(&db, &h).await, [1]);
    }
}

#[tokio::test]
async fn a_host_statement_after_a_lingering_call_runs_outside_the_walls() {
    for db in each_backend().await {
        let h = handler(&db, "wt_linger").await;
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        tx.enter_guest(CALL, &h).await.unwrap();
        guest_insert(&mut tx, &h, 1).await.unwrap();
        // Inside the walls the inbox is out of reach...
        let inside = format!("DELETE FROM {}", host_inbox(&tx));
        assert!(
            tx.guest_execute(&inside, &[]).await.is_err(),
            "{:?}",
            db.backend()
        );
        tx.exit_guest(CALL, true).await.unwrap();
        // ...and after the call, the host's statement leaves them first.
        assert!(claim(&mut tx, "wt_linger", "e1").await.unwrap());
        tx.commit().await.unwrap();
        assert_eq!(rows(&db, &h).await, [1], "{:?}", db.backend());
        assert_eq!(claims(&db).await, ["e1"]);
    }
}

#[tokio::test]
async fn the_same_handlers_next_call_renews_the_savepoint_and_a_failure_undoes_only_itself() {
    for db in each_backend().await {
        let h = handler(&db, "wt_renew").await;
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        for e in ["e1", "e2", "e3"] {
            assert!(claim(&mut tx, "wt_renew", e).await.unwrap());
        }
        // One batch: no host statement between the calls.
        for (a, succeeded) in [(1, true), (2, true), (3, false)] {
            tx.enter_guest(CALL, &h).await.unwrap();
            guest_insert(&mut tx, &h, a).await.unwrap();
            tx.exit_guest(CALL, succeeded).await.unwrap();
        }
        // The failed call took the walls down although they went up before
        // its (renewed) savepoint.
        assert!(claim(&mut tx, "wt_renew", "e4").await.unwrap());
        tx.commit().await.unwrap();
        assert_eq!(rows(&db, &h).await, [1, 2], "{:?}", db.backend());
        assert_eq!(claims(&db).await, ["e1", "e2", "e3", "e4"]);
    }
}

/// The optimistic batch's mode: nothing is sent between two calls, so a
/// failure undoes every call since the shared savepoint, never the claims
/// before it, and the walls still come down for the host.
#[tokio::test]
async fn a_shared_savepoint_is_kept_between_calls_and_a_failure_undoes_them_all() {
    for db in each_backend().await {
        let h = handler(&db, "wt_share").await;
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        tx.share_guest_savepoint(true);
        for e in ["e1", "e2", "e3"] {
            assert!(claim(&mut tx, "wt_share", e).await.unwrap());
        }
        for (a, succeeded) in [(1, true), (2, true), (3, false)] {
            tx.enter_guest(CALL, &h).await.unwrap();
            guest_insert(&mut tx, &h, a).await.unwrap();
            tx.exit_guest(CALL, succeeded).await.unwrap();
        }
        assert!(claim(&mut tx, "wt_share", "e4").await.unwrap());
        // Calls after a host statement get a savepoint of their own again.
        tx.enter_guest(CALL, &h).await.unwrap();
        guest_insert(&mut tx, &h, 4).await.unwrap();
        tx.exit_guest(CALL, true).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(rows(&db, &h).await, [4], "{:?}", db.backend());
        assert_eq!(claims(&db).await, ["e1", "e2", "e3", "e4"]);
    }
}

/// SQLite: two handlers' calls in one transaction. (On PostgreSQL a
/// transaction's session is one handler's own login, so this cannot happen:
/// see the next test.)
#[tokio::test]
async fn another_handlers_call_after_a_lingering_one_runs_in_its_own_walls() {
    {
        let db = sqlite_db().await;
        let a = handler(&db, "wt_first").await;
        let b = handler(&db, "wt_second").await;
        let mut tx = db.begin_write().await.unwrap();
        assert!(claim(&mut tx, "wt_first", "e1").await.unwrap());
        tx.enter_guest(CALL, &a).await.unwrap();
        guest_insert(&mut tx, &a, 1).await.unwrap();
        tx.exit_guest(CALL, true).await.unwrap();
        tx.enter_guest(CALL, &b).await.unwrap();
        let theirs = format!("SELECT a FROM {}", table(&db, &a));
        let read = tx.guest_query(&theirs, &[], 10, 1 << 20).await;
        assert!(read.is_err(), "{:?}: b read a's table", db.backend());
        assert!(guest_insert(&mut tx, &a, 9).await.is_err(), "b wrote a's table");
        guest_insert(&mut tx, &b, 2).await.unwrap();
        // b's failure undoes b's call only: a's was kept when b's began.
        tx.exit_guest(CALL, false).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(rows(&db, &a).await, [1], "{:?}", db.backend());
        assert_eq!(rows(&db, &b).await, Vec::<i64>::new());
        assert_eq!(claims(&db).await, ["e1"]);
    }
}

#[tokio::test]
async fn a_call_under_another_savepoint_keeps_the_lingering_calls_work() {
    for db in each_backend().await {
        let h = handler(&db, "wt_savepoints").await;
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        tx.enter_guest(CALL, &h).await.unwrap();
        guest_insert(&mut tx, &h, 1).await.unwrap();
        tx.exit_guest(CALL, true).await.unwrap();
        tx.enter_guest(OTHER_CALL, &h).await.unwrap();
        guest_insert(&mut tx, &h, 2).await.unwrap();
        tx.exit_guest(OTHER_CALL, false).await.unwrap();
        assert!(claim(&mut tx, "wt_savepoints", "e1").await.unwrap());
        tx.commit().await.unwrap();
        assert_eq!(rows(&db, &h).await, [1], "{:?}", db.backend());
    }
}

#[tokio::test]
async fn exit_guest_without_a_call_running_changes_nothing() {
    for db in each_backend().await {
        let h = handler(&db, "wt_noop").await;
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        tx.exit_guest(CALL, false).await.unwrap();
        tx.enter_guest(CALL, &h).await.unwrap();
        guest_insert(&mut tx, &h, 1).await.unwrap();
        tx.exit_guest(CALL, true).await.unwrap();
        // A second exit must not undo (or forget) the lingering call.
        tx.exit_guest(CALL, false).await.unwrap();
        assert!(claim(&mut tx, "wt_noop", "e1").await.unwrap());
        tx.commit().await.unwrap();
        assert_eq!(rows(&db, &h).await, [1], "{:?}", db.backend());
        assert_eq!(claims(&db).await, ["e1"]);
    }
}

/// SQLite: a migration's walls after another handler's call in one
/// transaction (impossible on PostgreSQL, as above).
#[tokio::test]
async fn migration_walls_take_a_lingering_call_down_first_and_come_down_for_the_host() {
    {
        let db = sqlite_db().await;
        let a = handler(&db, "wt_run").await;
        let b = handler(&db, "wt_migrate").await;
        let mut tx = db.begin_write().await.unwrap();
        tx.enter_guest(CALL, &a).await.unwrap();
        guest_insert(&mut tx, &a, 1).await.unwrap();
        tx.exit_guest(CALL, true).await.unwrap();
        let own = [format!("{}_t", b.handler())];
        let migration = Walls::new(b.handler(), Scope::Migration, &own, Duration::from_secs(5));
        tx.enter_walls(&migration).await.unwrap();
        // (A guest statement, for its statement savepoint: a failed
        // migration statement aborts a PostgreSQL transaction.)
        let theirs = format!("DELETE FROM {}", table(&db, &a));
        assert!(
            tx.guest_execute(&theirs, &[]).await.is_err(),
            "{:?}",
            db.backend()
        );
        let mine = format!("INSERT INTO {}_t (a) VALUES (2)", b.handler());
        tx.migration_execute(&mine).await.unwrap();
        tx.leave_walls().await.unwrap();
        assert!(claim(&mut tx, "wt_run", "e1").await.unwrap());
        tx.commit().await.unwrap();
        assert_eq!(rows(&db, &a).await, [1], "{:?}", db.backend());
        assert_eq!(rows(&db, &b).await, [2]);
    }
}

/// How each test ends the transaction that had a handler's walls up.
#[derive(Debug, Clone, Copy)]
enum End {
    CommitLingering,
    CommitInCall,
    RollbackInCall,
    RollbackLingering,
    DropInCall,
    DropLingering,
}

/// Regression: a transaction that ended with SQLite's walls still up left
/// them on the pooled connection, and the next transaction's host
/// statements (its ROLLBACK, even) were refused.
#[tokio::test]
async fn after_commit_rollback_or_drop_the_pooled_connection_is_outside_the_walls() {
    for db in one_connection_backends().await {
        let h = handler(&db, "wt_pool").await;
        // A mark only this connection has (a temporary table lives as long as it).
        let mark = match db.backend() {
            Backend::Sqlite => "temp.wt_connection",
            Backend::Postgres => "pg_temp.wt_connection",
        };
        let mut tx = db.begin_guest(h.handler()).await.unwrap();
        tx.execute("CREATE TEMP TABLE wt_connection (x INTEGER)", &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let backend = connection_id(&db, h.handler()).await;
        for (n, end) in [
            End::CommitLingering,
            End::CommitInCall,
            End::RollbackInCall,
            End::RollbackLingering,
            End::DropInCall,
            End::DropLingering,
        ]
        .into_iter()
        .enumerate()
        {
            let mut tx = db.begin_guest(h.handler()).await.unwrap();
            tx.enter_guest(CALL, &h).await.unwrap();
            guest_insert(&mut tx, &h, n as i64).await.unwrap();
            let lingering = matches!(
                end,
                End::CommitLingering | End::RollbackLingering | End::DropLingering
            );
            if lingering {
                tx.exit_guest(CALL, true).await.unwrap();
            }
            match end {
                End::CommitLingering | End::CommitInCall => tx.commit().await.unwrap(),
                End::RollbackInCall | End::RollbackLingering => tx.rollback().await.unwrap(),
                End::DropInCall | End::DropLingering => drop(tx),
            }
            // The pool has one connection: this is the same one, back outside the walls.
            let mut next = db.begin_guest(h.handler()).await.unwrap();
            let same = match db.backend() {
                // (PostgreSQL drops a session's temporary tables when its
                // connection goes back to the pool: its backend is the mark.)
                Backend::Postgres => next
                    .query("SELECT pg_backend_pid()", &[])
                    .await
                    .map(|r| r[0][0].clone()),
                Backend::Sqlite => next
                    .query(&format!("SELECT COUNT(*) FROM {mark}"), &[])
                    .await
                    .map(|_| backend.clone()),
            };
            assert_eq!(
                same.ok().as_ref(),
                Some(&backend),
                "{end:?} on {:?}: the connection was replaced",
                db.backend()
            );
            let event = format!("e{n}");
            assert!(claim(&mut next, "wt_pool", &event).await.unwrap(), "{end:?}");
            next.commit().await.unwrap();
        }
        assert_eq!(rows(&db, &h).await, [0, 1], "{:?}", db.backend());
        assert_eq!(claims(&db).await, ["e0", "e1", "e2", "e3", "e4", "e5"]);
    }
}

/// PostgreSQL: the backend of the handler pool's one connection (SQLite: nothing).
async fn connection_id(db: &Database, handler: &str) -> SqlValue {
    if db.backend() == Backend::Sqlite {
        return SqlValue::Null;
    }
    let mut tx = db.begin_guest(handler).await.unwrap();
    let pid = tx.query("SELECT pg_backend_pid()", &[]).await.unwrap()[0][0].clone();
    tx.commit().await.unwrap();
    pid
}

/// SQLite, and PostgreSQL when the suite's server is there, each with a pool
/// of one connection, so the next transaction surely runs on the last one's.
async fn one_connection_backends() -> Vec<OneConnection> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("test.sqlite").display());
    let mut all = vec![OneConnection::new(&url, Some(dir)).await];
    if let Some(url) = crate::db::test_support::postgres_url().await {
        all.push(OneConnection::new(&url, None).await);
    }
    all
}

struct OneConnection {
    db: Database,
    _dir: Option<tempfile::TempDir>,
}

impl OneConnection {
    async fn new(url: &str, dir: Option<tempfile::TempDir>) -> Self {
        let db = Database::connect(url, 1).await.unwrap();
        db.migrate_host().await.unwrap();
        Self { db, _dir: dir }
    }
}

impl std::ops::Deref for OneConnection {
    type Target = Database;
    fn deref(&self) -> &Database {
        &self.db
    }
}

/// Regression: SQLite rolls the whole transaction back when a writing guest
/// statement is interrupted at its deadline; the host begins a new one, the
/// rest of the call stays walled in, and the call does not linger (its
/// savepoint is gone).
#[tokio::test]
async fn a_lost_sqlite_transaction_is_restarted_and_the_call_stays_walled_until_it_ends() {
    let db = sqlite_db().await;
    handler(&db, "wt_lost").await;
    let own = ["wt_lost_t".to_owned()];
    let h = Walls::new("wt_lost", Scope::Guest, &own, Duration::from_millis(200));
    let mut tx = db.begin_write().await.unwrap();
    assert!(claim(&mut tx, "wt_lost", "e1").await.unwrap());
    tx.enter_guest(CALL, &h).await.unwrap();
    guest_insert(&mut tx, &h, 1).await.unwrap();
    tx.set_ctes(["n".to_owned()].into());
    let endless = "INSERT INTO wt_lost_t WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n";
    let err = tx.guest_execute(endless, &[]).await.unwrap_err();
    assert!(matches!(err, DbError::StatementTimeout), "{err}");
    assert!(tx.is_lost());
    // Still inside the walls, in the new transaction.
    assert!(tx.guest_execute("DELETE FROM inbox", &[]).await.is_err());
    // Even a "successful" end does not linger: its savepoint died.
    tx.exit_guest(CALL, true).await.unwrap();
    assert!(tx.take_lost(), "the host is told once");
    assert!(!tx.take_lost());
    // Outside the walls, in a transaction that works.
    assert!(claim(&mut tx, "wt_lost", "e2").await.unwrap());
    tx.commit().await.unwrap();
    let h = Walls::load(&db, "wt_lost", Duration::from_secs(5)).await.unwrap();
    assert_eq!(rows(&db, &h).await, Vec::<i64>::new(), "the lost work is gone");
    assert_eq!(
        claims(&db).await,
        ["e2"],
        "the lost claim is gone, the new one kept"
    );
}

/// Regression (the seventeenth adversarial read, issue 23): when the
/// backstop dropped a guest call whose SQLite statement was still running,
/// leaving the call took the walls down under the statement, its deadline
/// with them, and a recursive query ran on for good while the host's
/// ROLLBACK TO waited behind it, holding the only writer. Now the host
/// interrupts the statement and waits for it inside the walls first.
#[tokio::test]
async fn a_dropped_sqlite_call_is_interrupted_inside_its_walls_before_they_come_down() {
    let db = sqlite_db().await;
    handler(&db, "wt_stuck").await;
    let own = ["wt_stuck_t".to_owned()];
    let h = Walls::new("wt_stuck", Scope::Guest, &own, Duration::from_secs(30));
    let mut tx = db.begin_write().await.unwrap();
    assert!(claim(&mut tx, "wt_stuck", "e1").await.unwrap());
    tx.enter_guest(CALL, &h).await.unwrap();
    tx.set_ctes(["n".to_owned()].into());
    let endless = "SELECT count(*) FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n)";
    // The backstop, early: the call is dropped mid-statement.
    let call = tokio::time::timeout(
        Duration::from_millis(200),
        tx.guest_query(endless, &[], 10, 1 << 20),
    )
    .await;
    assert!(call.is_err(), "the statement was still running: {call:?}");
    // Well inside the walls' own 30 s deadline: the interrupt ended it.
    let settled = tokio::time::timeout(Duration::from_secs(10), async {
        tx.abandon_stuck_call().await.unwrap();
        tx.exit_guest(CALL, false).await.unwrap();
        assert!(claim(&mut tx, "wt_stuck", "e2").await.unwrap());
        tx.commit().await.unwrap();
    })
    .await;
    assert!(
        settled.is_ok(),
        "the host waited on a statement it could not stop"
    );
    assert_eq!(
        claims(&db).await,
        ["e1", "e2"],
        "the transaction survived the interrupted read"
    );
}

/// Regression (the fourteenth adversarial read, issue 23): SQLite bounds
/// each value but not a row, and the host copies a returned row twice
/// before it can weigh it; inside the walls a row has at most
/// `MAX_COLUMNS` columns, outside them the host's own statements have
/// SQLite's usual limit again.
#[tokio::test]
async fn sqlite_rows_inside_the_walls_have_at_most_max_columns() {
    use crate::sandbox::authorizer::MAX_COLUMNS;
    let db = sqlite_db().await;
    let h = handler(&db, "wt_wide").await;
    let select = |columns: std::ffi::c_int| format!("SELECT {}", vec!["$1"; columns as usize].join(", "));
    let mut tx = db.begin_write().await.unwrap();
    tx.enter_guest(CALL, &h).await.unwrap();
    let value = SqlValue::from("x".repeat(1000));
    let err = tx
        .guest_query(
            &select(MAX_COLUMNS + 1),
            std::slice::from_ref(&value),
            10,
            1 << 20,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("too many columns"), "{err}");
    let rows = tx
        .guest_query(&select(MAX_COLUMNS), std::slice::from_ref(&value), 10, 1 << 20)
        .await
        .unwrap();
    assert_eq!(rows[0].len(), MAX_COLUMNS as usize);
    tx.exit_guest(CALL, true).await.unwrap();
    let host = tx
        .query(&select(200), std::slice::from_ref(&value))
        .await
        .unwrap();
    assert_eq!(host[0].len(), 200, "the host's own statements are not held to it");
    tx.commit().await.unwrap();
}

/// The PostgreSQL leave statement puts back the host's own search path.
#[test]
fn leaving_restores_the_hosts_search_path() {
    assert!(PG_LEAVE.contains(&format!("'search_path', '{HOST_SEARCH_PATH}'")));
}
