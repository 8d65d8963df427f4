//! `handler_hosts`: which host runs which handler, for the operator console.
//!
//! Every host refreshes its own rows every [`BEAT`] and deletes them when it
//! stops. A row older than [`GONE_AFTER_MS`] is a host that died without
//! saying so: readers skip it. Rows are deleted only after [`FORGET_AFTER_MS`],
//! so a host whose clock runs behind another's by more than a minute is not
//! deleted by that other host's beats.

use super::{Registry, Running};
use crate::db::columns::Columns;
use crate::db::{Database, DbError, SqlValue, in_list, now_ms};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a host says what it runs. One small write: on SQLite it queues
/// behind the writer like any transaction, so it must stay rare.
pub const BEAT: Duration = Duration::from_secs(5);

/// Twelve missed beats: long enough that a host stalled by a slow database is
/// not shown as gone, short enough that a crashed one drops off within a minute.
pub const GONE_AFTER_MS: i64 = 60_000;

/// When any host deletes a silent host's rows.
pub const FORGET_AFTER_MS: i64 = 3_600_000;

/// A beat or the last goodbye that takes longer is given up: a host whose
/// database is away must still stop promptly.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// One host running one handler, as that host last said.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HostRow {
    pub host: String,
    pub version: String,
    pub consuming: bool,
    pub seen_at: i64,
}

/// Records what this host runs now (its rows updated in place), drops the
/// handlers it no longer runs, and forgets hosts silent for [`FORGET_AFTER_MS`].
pub async fn beat(db: &Database, host: &str, running: &BTreeMap<String, Running>) -> Result<(), DbError> {
    let now = now_ms();
    let mut tx = db.begin_write().await?;
    tx.execute(
        "DELETE FROM handler_hosts WHERE host <> $1 AND seen_at < $2",
        &[host.into(), (now - FORGET_AFTER_MS).into()],
    )
    .await?;
    for handler in running.values() {
        tx.execute(
            "INSERT INTO handler_hosts (host, handler, version, consuming, seen_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (host, handler) DO UPDATE
             SET version = excluded.version, consuming = excluded.consuming, seen_at = excluded.seen_at",
            &[
                host.into(),
                handler.name.as_str().into(),
                handler.version.as_str().into(),
                i64::from(handler.consuming).into(),
                now.into(),
            ],
        )
        .await?;
    }
    // This host's rows for handlers it no longer runs.
    let mut params: Vec<SqlValue> = vec![host.into()];
    let kept = in_list("handler", &mut params, running.keys().map(String::as_str));
    tx.execute(
        &format!("DELETE FROM handler_hosts WHERE host = $1 AND NOT ({kept})"),
        &params,
    )
    .await?;
    tx.commit().await
}

/// Deletes this host's rows: it stopped.
pub async fn leave(db: &Database, host: &str) -> Result<(), DbError> {
    let mut tx = db.begin_write().await?;
    tx.execute("DELETE FROM handler_hosts WHERE host = $1", &[host.into()])
        .await?;
    tx.commit().await
}

/// The live hosts of every handler, by handler name.
pub async fn by_handler(db: &Database) -> Result<BTreeMap<String, Vec<HostRow>>, DbError> {
    let rows = db
        .query(
            "SELECT handler, host, version, consuming, seen_at FROM handler_hosts
             WHERE seen_at >= $1 ORDER BY handler, host",
            &[(now_ms() - GONE_AFTER_MS).into()],
        )
        .await?;
    let mut hosts: BTreeMap<String, Vec<HostRow>> = BTreeMap::new();
    for row in rows {
        let mut c = Columns::new("handler_hosts row", row);
        let handler = c.text("handler")?;
        hosts.entry(handler).or_default().push(HostRow {
            host: c.text("host")?,
            version: c.text("version")?,
            consuming: c.int("consuming")? != 0,
            seen_at: c.int("seen_at")?,
        });
    }
    Ok(hosts)
}

/// Beats until `shutdown`, then leaves. A failed beat is retried at the next
/// one; the console shows the host as gone only after [`GONE_AFTER_MS`].
pub async fn run(registry: Registry, shutdown: CancellationToken) {
    let db = registry.db().clone();
    let host = registry.host_id().to_owned();
    let mut failing = false;
    loop {
        let running = registry.running().await;
        let error = match tokio::time::timeout(WRITE_TIMEOUT, beat(&db, &host, &running)).await {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some(format!("no answer within {WRITE_TIMEOUT:?}")),
        };
        match error {
            None => failing = false,
            Some(error) if !failing => {
                failing = true;
                tracing::warn!("cannot record this host in handler_hosts (retrying every {BEAT:?}): {error}");
            }
            Some(_) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(BEAT) => {}
        }
    }
    match tokio::time::timeout(WRITE_TIMEOUT, leave(&db, &host)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!("cannot remove this host from handler_hosts: {error}"),
        Err(_) => tracing::debug!("removing this host from handler_hosts timed out; its rows age out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::each_backend;
    use crate::registry::Source;

    fn running(name: &str, consuming: bool) -> Running {
        Running {
            name: name.into(),
            source: Source::Config,
            version: format!("{name}@1"),
            consuming,
            paused: !consuming,
            settings: crate::registry::Settings::of(
                &crate::config::HandlerConfig::from_settings(name, r#"{"topics": ["orders"]}"#).unwrap(),
            ),
        }
    }

    #[tokio::test]
    async fn each_host_replaces_its_rows_and_leaves_when_it_stops() {
        for test in each_backend().await {
            let db: &Database = &test;
            let backend = db.backend();
            let first = BTreeMap::from([
                ("billing".to_owned(), running("billing", true)),
                ("emails".to_owned(), running("emails", false)),
            ]);
            beat(db, "host-a", &first).await.unwrap();
            beat(
                db,
                "host-b",
                &BTreeMap::from([("billing".to_owned(), running("billing", true))]),
            )
            .await
            .unwrap();
            // host-a stops running emails: its next beat says so.
            beat(
                db,
                "host-a",
                &BTreeMap::from([("billing".to_owned(), running("billing", true))]),
            )
            .await
            .unwrap();
            let hosts = by_handler(db).await.unwrap();
            let names = |h: &str| -> Vec<String> { hosts[h].iter().map(|r| r.host.clone()).collect() };
            assert_eq!(names("billing"), ["host-a", "host-b"], "{backend:?}");
            assert!(!hosts.contains_key("emails"), "{backend:?}");
            assert!(hosts["billing"][0].consuming);

            // A host that runs nothing any more keeps no row.
            let billing_only = BTreeMap::from([("billing".to_owned(), running("billing", true))]);
            beat(db, "host-c", &billing_only).await.unwrap();
            beat(db, "host-c", &BTreeMap::new()).await.unwrap();
            assert_eq!(by_handler(db).await.unwrap()["billing"].len(), 2, "{backend:?}");

            // A host silent for a minute is not shown; after an hour it is deleted.
            let age = |ms: i64| async move {
                db.query(
                    "UPDATE handler_hosts SET seen_at = $1 WHERE host = 'host-b'",
                    &[(now_ms() - ms).into()],
                )
                .await
            };
            age(GONE_AFTER_MS + 1).await.unwrap();
            assert_eq!(by_handler(db).await.unwrap()["billing"].len(), 1, "{backend:?}");
            leave(db, "host-a").await.unwrap();
            assert!(by_handler(db).await.unwrap().is_empty(), "{backend:?}");
            beat(db, "host-a", &BTreeMap::new()).await.unwrap();
            let rows = || db.query_i64("SELECT COUNT(*) FROM handler_hosts", &[]);
            assert_eq!(
                rows().await.unwrap(),
                1,
                "host-b is kept for an hour: {backend:?}"
            );
            age(FORGET_AFTER_MS + 1).await.unwrap();
            beat(db, "host-a", &BTreeMap::new()).await.unwrap();
            assert_eq!(rows().await.unwrap(), 0, "{backend:?}");
        }
    }
}
