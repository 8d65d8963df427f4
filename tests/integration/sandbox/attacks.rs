//! The catalogue of attacks the hostile guest runs in
//! `hostile_guests_cannot_touch_dedup_and_the_host_stays_up`: each a payload
//! for the guest and the text its dead letter's reason must contain.

use crate::support::*;
use serde_json::{Value, json};

/// (attack payload, text its dead letter's reason must contain)
pub fn attacks(brokers: &str, backend: Backend) -> Vec<(Value, &'static str)> {
    let sql = |statement: &str| json!({ "attack": "sql", "statement": statement });
    let forbidden = "Forbidden";
    let mut list = vec![
        (sql("DELETE FROM inbox"), forbidden),
        (sql("delete from INBOX where 1 = 1"), forbidden),
        (sql("DELETE FROM \"inbox\""), forbidden),
        (sql("DELETE FROM main.inbox"), forbidden),
        (sql("DELETE FROM inboxd.inbox"), forbidden),
        (sql("UPDATE offsets SET next_offset = 0"), forbidden),
        (
            sql(
                "INSERT INTO inbox (handler, event_id, status, topic, partition, \"offset\", handler_version, processed_at, id_day) VALUES ('billing', 'x', 'done', 't', 0, 0, 'v', 0, 0)",
            ),
            forbidden,
        ),
        (
            sql("WITH gone AS (DELETE FROM inbox RETURNING *) SELECT count(*) FROM gone"),
            forbidden,
        ),
        (sql("WITH inbox AS (SELECT 1) DELETE FROM inbox"), forbidden),
        (sql("CREATE VIEW v AS SELECT * FROM inbox"), forbidden),
        (
            sql("CREATE TRIGGER t AFTER INSERT ON hostile_effects BEGIN DELETE FROM inbox; END"),
            forbidden,
        ),
        (sql("BEGIN"), forbidden),
        (sql("COMMIT"), forbidden),
        (sql("ROLLBACK"), forbidden),
        (sql("SAVEPOINT s"), forbidden),
        (sql("RELEASE SAVEPOINT inboxd_guest"), forbidden),
        (sql("SET ROLE postgres"), forbidden),
        (sql("RESET ROLE"), forbidden),
        (sql("SET SESSION AUTHORIZATION postgres"), forbidden),
        (sql("SELECT set_config('role', 'postgres', true)"), forbidden),
        (
            sql("INSERT INTO hostile_effects (event_id) VALUES ('two'); DELETE FROM inbox"),
            forbidden,
        ),
        (
            sql("SELECT 1 /* harmless */; DELETE FROM inbox -- trailing"),
            forbidden,
        ),
        (sql("DELETE/**/FROM/**/inbox"), forbidden),
        (sql("DROP TABLE hostile_effects"), forbidden),
        (sql("ALTER TABLE hostile_effects ADD COLUMN x TEXT"), forbidden),
        (sql("ATTACH DATABASE '/tmp/inboxd-hostile.db' AS x"), forbidden),
        (sql("PRAGMA writable_schema = ON"), forbidden),
        (sql("VACUUM INTO '/tmp/inboxd-hostile-copy.db'"), forbidden),
        (sql("SELECT load_extension('/tmp/evil.so')"), forbidden),
        (
            sql("COPY hostile_effects TO '/tmp/inboxd-hostile.csv'"),
            forbidden,
        ),
        (sql("SELECT pg_read_file('/etc/passwd')"), forbidden),
        (sql("SELECT lo_import('/etc/passwd')"), forbidden),
        (
            sql("SELECT * FROM dblink('host=127.0.0.1', 'DELETE FROM inboxd.inbox') AS t(a int)"),
            forbidden,
        ),
        (sql("DELETE FROM invoices"), forbidden),
        // Regression: an inner CTE named like billing's table hid the outer,
        // real reference from the guard; `TABLE name` was not checked at all.
        (
            json!({ "attack": "query", "statement": "SELECT customer_email FROM invoices WHERE EXISTS (WITH invoices AS (SELECT 1) SELECT 1 FROM invoices)" }),
            forbidden,
        ),
        (
            json!({ "attack": "query", "statement": "TABLE invoices" }),
            forbidden,
        ),
        (
            json!({ "attack": "query", "statement": "SELECT 1 UNION TABLE inbox" }),
            forbidden,
        ),
        (sql("SELECT lpad('x', 1000000000)"), forbidden),
        // Regression: a parameter list the driver cannot encode was taken for
        // a broken connection and retried forever.
        (
            json!({ "attack": "params", "statement": "SELECT 1", "count": 70_000 }),
            "parameters",
        ),
        // Regression: an endless statement held SQLite's only writer and a
        // PostgreSQL connection for minutes.
        (
            json!({ "attack": "query", "statement": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n" }),
            "limits.timeout_ms",
        ),
        // Regression: an endless *write*, stopped at the deadline, made SQLite
        // roll back the whole batch (claims included) behind the host's back.
        (
            sql(
                "INSERT INTO hostile_effects WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT 'x' FROM n",
            ),
            "limits.timeout_ms",
        ),
        (
            sql("INSERT OR ROLLBACK INTO hostile_effects (event_id) VALUES ('x')"),
            forbidden,
        ),
        (sql("SELECT $0"), forbidden),
        (sql("SELECT 1 --\u{0}"), forbidden),
        (sql("DELETE FROM handler_billing.invoices"), forbidden),
        // Regression (issue 23): PostgreSQL reads `(x).f` as the call f(x);
        // ts_stat(text) runs its text as a query.
        (
            json!({ "attack": "query", "statement": "SELECT ('SELECT to_tsvector(event_id) FROM inboxd.inbox'::text).ts_stat" }),
            forbidden,
        ),
        (
            json!({ "attack": "query", "statement": "SELECT e.event_id.ts_stat FROM hostile_effects e" }),
            forbidden,
        ),
        (
            json!({ "attack": "query", "statement": "SELECT 'inboxd.inbox'::regclass" }),
            forbidden,
        ),
        // Regression (issue 23): one call that runs longer than any deadline.
        (
            json!({ "attack": "query", "statement": "SELECT instr(event_id, 'x') FROM hostile_effects" }),
            forbidden,
        ),
        // Regression (issue 23): a statement whose syntax tree, dropped,
        // overflowed the stack and aborted the host (here within the test's
        // statement limit; the parser's unit tests go to 64 KiB).
        (sql(&format!("SELECT 1{}", "+1".repeat(1010))), "at most 1000"),
        (
            sql(&format!("SELECT '{}'", "x".repeat(3_000))),
            "limits.max_statement_bytes",
        ),
        (
            json!({ "attack": "repeat", "statement": "SELECT 1", "times": 60 }),
            "limits.max_statements",
        ),
        (
            json!({ "attack": "query", "statement": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) SELECT i FROM n" }),
            "limits.max_rows",
        ),
        (json!({ "attack": "loop" }), "limits.timeout_ms"),
        (json!({ "attack": "memory" }), "limits.memory_mb"),
        (json!({ "attack": "recurse" }), "handler trapped"),
        (json!({ "attack": "probe-env" }), "env=0 args=0"),
        (json!({ "attack": "probe-fs" }), "fs list=err read=err create=err"),
        (
            json!({ "attack": "probe-net", "address": brokers }),
            "net connect=err",
        ),
        (
            json!({ "attack": "padding", "padding": "p".repeat(5_000) }),
            "limits.max_payload_bytes",
        ),
    ];
    // Regression (issue 23): a stored value doubled event after event
    // towards 1 GB, and one row's calls over it outlived every deadline. (The
    // longest row is the greatest: each starts with 'zz' and the last.)
    let too_big = match backend {
        Backend::Sqlite => "string or blob too big",
        Backend::Postgres => "inboxd_row_bound",
    };
    list.push((
        json!({ "attack": "repeat", "statement": "INSERT INTO hostile_effects SELECT 'zz' || coalesce(max(event_id), '') || coalesce(max(event_id), '') FROM hostile_effects", "times": 40 }),
        too_big,
    ));
    if backend == Backend::Sqlite {
        // The twenty-second adversarial read: 64 copies of the stored value
        // (about a megabyte, from the attack above) under 14 levels of
        // subqueries, three times, ran SQLite's heap to its 2 GiB ceiling
        // (24 copies twice here: the payload's bound is 4 KB),
        // which took the transaction and was retried as an outage for good;
        // and a CTE named like an own table was read where SQLite reads the
        // CTE (2^n copies while preparing, past every deadline).
        let columns: Vec<String> = (0..24).map(|i| format!("x.event_id AS c{i}")).collect();
        let mut chain = format!("SELECT {} FROM hostile_effects x", columns.join(", "));
        for _ in 0..13 {
            chain = format!("SELECT * FROM ({chain}) LIMIT 1");
        }
        let one = format!("(SELECT length(c0) FROM ({chain}))");
        list.extend([
            (
                json!({ "attack": "query", "statement": format!("SELECT {one}, {one}") }),
                "values at once",
            ),
            (
                sql(
                    "WITH a AS (SELECT 1 AS x FROM hostile_effects p, hostile_effects q), \
                     hostile_effects AS (SELECT 1 AS event_id) SELECT count(*) FROM a",
                ),
                "may not be named like your table hostile_effects",
            ),
        ]);
    }
    if backend == Backend::Postgres {
        let upper = vec!["upper(event_id)"; 60].join(", ");
        list.extend([
            (
                json!({ "attack": "query", "statement": format!("SELECT {upper} FROM hostile_effects") }),
                "limits.max_row_bytes",
            ),
            (
                json!({ "attack": "query", "statement": "SELECT event_id || ARRAY['a'] FROM hostile_effects" }),
                "an array is allowed only",
            ),
            // The tenth adversarial read: jsonb's operators rebuild a stored
            // document in memory, gigabytes in one row.
            (
                json!({ "attack": "query", "statement": "SELECT (event_id::jsonb - event_id) IS NULL FROM hostile_effects" }),
                "jsonb is not allowed on PostgreSQL",
            ),
            // The sixth adversarial read: reading an object into jsonb sorts
            // its keys, quadratic for a crafted order, without interruption.
            (
                json!({ "attack": "query", "statement": "SELECT event_id::json FROM hostile_effects" }),
                "a cast to json or jsonb may take only a parameter or a literal",
            ),
            (
                json!({ "attack": "query", "statement": "SELECT to_timestamp(event_id, event_id) FROM hostile_effects" }),
                "to_timestamp(x, format) needs a literal format",
            ),
            (
                json!({ "attack": "query", "statement": "SELECT length((event_id::numeric * 2)::text) FROM hostile_effects" }),
                "numeric(p, s)",
            ),
            (json!({ "attack": "query", "statement": "SELECT 2.0 ^ 100000" }), "operator ^"),
            // The forty-second adversarial read: a session keeps every time
            // zone it reads from text and every record type it evaluates.
            (
                json!({ "attack": "query", "statement": "SELECT CAST(event_id AS timestamptz) FROM hostile_effects" }),
                "a cast to a date or time",
            ),
            (
                json!({ "attack": "query", "statement": "SELECT 1 WHERE now() > '2020-01-01 qaab+1qab'" }),
                "POSIX rule",
            ),
            (
                json!({ "attack": "bind", "statement": "SELECT $1::timestamptz", "values": ["2020-01-01 qaab+1qab"] }),
                "names a time zone as a POSIX rule",
            ),
            (
                json!({ "attack": "query", "statement": "SELECT CAST((1, 'a') AS text)" }),
                "row constructor",
            ),
            // The forty-fifth read: a time of day's text names a zone at
            // its start, and a blob's text is its hex (`\x01ab02`: the rule
            // `X01AB02`).
            (
                json!({ "attack": "query", "statement": "SELECT 1 WHERE current_time < 'qaab+1 101010'" }),
                "time and timetz are not allowed",
            ),
            (
                json!({ "attack": "bind", "statement": "SELECT CAST(CAST($1 AS text) AS timestamptz)", "values": [{ "blob": [1, 171, 2] }] }),
                "must be text",
            ),
            // The nineteenth to twenty-first adversarial reads: the planner
            // copies an unfenced subquery's computed column into each
            // reference, level by level (six levels of ten: 339 MB).
            (
                json!({ "attack": "query", "statement": copied_chain(6, 10) }),
                "copy each computed column into every place that reads it",
            ),
        ]);
    }
    list.shrink_to_fit();
    list
}

/// `levels` subqueries, each reading the one below `refs` times.
fn copied_chain(levels: usize, refs: usize) -> String {
    (1..=levels).fold("SELECT 1 AS x".to_owned(), |inner, level| {
        let read = vec![format!("p{level}.x"); refs].join(", ");
        format!("SELECT coalesce({read}) AS x FROM ({inner}) AS p{level}")
    })
}
